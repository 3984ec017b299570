"""The types that pass between the stages, in the order the data flows.

A stage imports these, never another stage (``tests/pipeline/test_architecture.py`` checks it):

=====================  ==========================================================================
type                   made by -> used by
=====================  ==========================================================================
``PolledBatch``        the Kafka edge (:mod:`pipeline.connectors.kafka`) -> source -> decode ->
                       batch (consumed messages as columns; :mod:`pipeline.polled`)
``DecodedMessages``    decode -> retrieval (:mod:`pipeline.runtime.retrieve`) -> the loop (offsets,
                       dead letters) and batch
``EventColumns``       decode -> batch -> enrich / features / publish (the events as columns;
                       :mod:`pipeline.columns`)
``Checkpoint``         commit (``Checkpointer.cut``) -> publish / dead letters (acknowledgements
                       travel with the records they guard)
``Batch``              batch + commit -> :class:`~pipeline.runtime.processor.BatchProcessor`
``Enrichment``         enrich -> features, publish (fallback flags)
``PreparedBatch``      features -> score (the model input on its way to the device)
``ScoredBatch``        score -> publish (top-K item ids and scores of every event)
``RejectedMessage``    decode, retrieval, poison isolation -> the dead-letter stage
                       (``RejectReason``)
=====================  ==========================================================================

Everything per event is a column: numpy arrays, and the values, keys and headers the Kafka
client made as it consumed them (``PolledBatch``). No stage sees a Kafka client's type; a
message is taken out whole only to be dead-lettered (``ConsumedMessage``).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pipeline.columns import EventColumns, FieldColumns
from pipeline.polled import ConsumedMessage, Headers, Partition, PolledBatch

if TYPE_CHECKING:  # torch is imported by the commands that score, not by every command
    from model.serving.transfer import StagedInput

__all__ = [
    "Batch",
    "Checkpoint",
    "ConsumedMessage",
    "DecodedMessages",
    "DeliveryFailed",
    "Enrichment",
    "EventColumns",
    "FallbackFeature",
    "FieldColumns",
    "Headers",
    "Partition",
    "PolledBatch",
    "PreparedBatch",
    "RejectReason",
    "RejectedMessage",
    "ScoredBatch",
]

Int64Array = npt.NDArray[np.int64]


class RejectReason(enum.StrEnum):
    """Why a message went to the dead-letter topic (the ``x-dlq-reason`` header)."""

    EMPTY = "empty_value"
    OVERSIZED = "oversized_message"
    UNDECODABLE = "undecodable"
    BAD_FRAMING = "bad_framing"
    UNKNOWN_SCHEMA = "unknown_schema"
    SCHEMA_MISMATCH = "schema_mismatch"
    NO_CANDIDATES = "no_candidates"
    TOO_MANY_CANDIDATES = "too_many_candidates"
    ID_OUT_OF_RANGE = "id_out_of_range"
    INVALID_FIELD = "invalid_field"
    TOO_MANY_RECENT_ITEMS = "too_many_recent_items"
    INVALID_STRING = "invalid_string"
    INVALID_EVENT_TIME = "invalid_event_time"
    PROCESSING_ERROR = "processing_error"
    """Decoded and valid, but a step after decode (enrich, features, forward, top-K, encode)
    fails for this event alone (:mod:`pipeline.runtime.isolation`)."""


class RejectedMessage(Exception):
    """A message that cannot be scored. ``reason`` is stable; ``detail`` is for humans.

    Example::

        raise RejectedMessage(RejectReason.NO_CANDIDATES, "candidate_item_ids is empty")
    """

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


class DeliveryFailed(RuntimeError):
    """A record could not be delivered; the offsets it guards were not committed."""


class FallbackFeature(enum.StrEnum):
    """Feature groups that can fall back to defaults (``Recommendation.fallback_features``)."""

    USER = "user_features"
    ITEM = "item_features"


@dataclass
class DecodedMessages:
    """What a run of consumed messages decoded to (the decode stage's output).

    Attributes:
        messages: the consumed messages (``M``), in consumption order, as columns.
        events: the accepted events (``E``), in message order.
        event_message: int64[E], the index in ``messages`` of each accepted event.
        rejections: (index in ``messages``, why) of every rejected message, in order.
    """

    messages: PolledBatch
    events: EventColumns
    event_message: Int64Array
    rejections: list[tuple[int, RejectedMessage]]

    @property
    def topic(self) -> str:
        return self.messages.topic

    @property
    def partitions(self) -> Int64Array:
        """int64[M] each message's partition."""
        return self.messages.partitions

    @property
    def offsets(self) -> Int64Array:
        """int64[M] each message's offset."""
        return self.messages.offsets

    def split(self, events: int) -> tuple[DecodedMessages, DecodedMessages]:
        """The messages up to the ``events``-th accepted event (excluded), and the rest.

        The head holds ``events`` accepted events and every rejected message before the first
        event it does not hold (all of them when it holds every event).
        """
        cut = int(self.event_message[events]) if events < self.events.num_events else len(self)
        head = DecodedMessages(
            self.messages.slice(0, cut),
            self.events.slice(0, events),
            self.event_message[:events],
            [r for r in self.rejections if r[0] < cut],
        )
        tail = DecodedMessages(
            self.messages.slice(cut),
            self.events.slice(events),
            self.event_message[events:] - cut,
            [(i - cut, r) for i, r in self.rejections if i >= cut],
        )
        return head, tail

    def without_partitions(self, partitions: set[Partition]) -> DecodedMessages:
        """These messages less those of ``partitions`` (a revocation)."""
        keep = ~self.messages.in_partitions(partitions)
        if keep.all():
            return self
        new_index = np.cumsum(keep) - 1
        event_keep = np.flatnonzero(keep[self.event_message])
        return DecodedMessages(
            self.messages.where(keep),
            self.events.take(event_keep),
            new_index[self.event_message[event_keep]],
            [(int(new_index[i]), r) for i, r in self.rejections if keep[i]],
        )

    def with_events(self, events: EventColumns) -> DecodedMessages:
        """These messages with their accepted events replaced (same events, new columns: e.g.
        retrieved candidates)."""
        if events.num_events != self.events.num_events:
            raise ValueError(f"{events.num_events} events for {self.events.num_events}")
        return DecodedMessages(self.messages, events, self.event_message, self.rejections)

    def reject_events(self, which: Int64Array, rejection: RejectedMessage) -> DecodedMessages:
        """These messages with the accepted events ``which`` (indices into ``events``) rejected
        after all, for ``rejection``; the other events and every message keep their places.

        Example::

            decoded.reject_events(np.flatnonzero(counts == 0), RejectedMessage(...))
        """
        if not len(which):
            return self
        keep = np.ones(self.events.num_events, dtype=bool)
        keep[which] = False
        rejected = [(int(i), rejection) for i in self.event_message[which].tolist()]
        return DecodedMessages(
            self.messages,
            self.events.take(np.flatnonzero(keep)),
            self.event_message[keep],
            sorted(self.rejections + rejected, key=lambda r: r[0]),
        )

    def event_messages(self) -> PolledBatch:
        """The source message of every accepted event."""
        messages = self.messages
        if len(self.event_message) == len(messages):  # every message is an event: all of them
            return messages
        return messages.take(self.event_message)

    def __len__(self) -> int:
        return len(self.messages)


@dataclass
class Checkpoint:
    """The offsets a group of produced records guards, and their acknowledgements.

    Attributes:
        next_offsets: (topic, partition) -> offset to commit (last consumed offset + 1).
        pending: records produced (counted in by :meth:`expect`) and not acknowledged yet.
        sealed: every record of it has been produced (it can commit once ``pending`` is 0).
        error: the first delivery error, if any.
        before_produce: called before each record is produced (exactly-once begins the
            transaction there).
    """

    next_offsets: dict[Partition, int] = field(default_factory=dict)
    pending: int = 0
    sealed: bool = False
    error: str | None = None
    before_produce: Callable[[], None] | None = None

    def expect(self, records: int = 1) -> None:
        """Count ``records`` more produced on behalf of these offsets (before producing them:
        the Kafka edge acknowledges each one here, :mod:`pipeline.connectors.kafka.producer`).
        """
        if self.before_produce is not None:
            self.before_produce()
        self.pending += records

    def failed(self, reason: str) -> None:
        """A record produced for it was not delivered: nothing at or after it commits."""
        if self.error is None:
            self.error = reason

    def seal(self) -> None:
        """Every record of this checkpoint is produced: it commits once they are acknowledged."""
        self.sealed = True

    @property
    def done(self) -> bool:
        return self.sealed and self.pending == 0


@dataclass
class Batch:
    """A closed micro-batch: its events, their source messages, and the checkpoint its records
    guard (every message consumed up to the batch's close, dead-lettered ones included).

    Attributes:
        events: the events as columns.
        messages: per event, the consumed message it came from (one row each).
        checkpoint: cut when the batch closed; sealed once its records are produced.
    """

    events: EventColumns
    messages: PolledBatch
    checkpoint: Checkpoint

    def take(self, order: Int64Array) -> Batch:
        """The events ``order`` of this batch, with their messages, on the same checkpoint."""
        return Batch(self.events.take(order), self.messages.take(order), self.checkpoint)


@dataclass
class Enrichment:
    """Redis features of one batch, aligned with its events (``E``) and rows (``R``).

    Attributes:
        user_dense: float32[E, user_dense_dim].
        user_recent_counts: int64[E], stored recent items of each event's user.
        user_recent_ids: int64[user_recent_counts.sum()], event-major, newest first.
        user_missing: bool[E], True where user features fell back to defaults.
        item_category: int64[R] raw category ids.
        item_dense: float32[R, item_dense_dim].
        item_missing: bool[R], True where item features fell back to defaults.
        user_fields / item_fields: a configured Redis layout's fields (``E`` users, ``R``
            items; :class:`~pipeline.columns.FieldColumns`); ``None`` with the built-in layout
            (whose columns are the ones above; a configured layout leaves those empty).
    """

    user_dense: npt.NDArray[np.float32]
    user_recent_counts: Int64Array
    user_recent_ids: Int64Array
    user_missing: npt.NDArray[np.bool_]
    item_category: Int64Array
    item_dense: npt.NDArray[np.float32]
    item_missing: npt.NDArray[np.bool_]
    user_fields: FieldColumns | None = None
    item_fields: FieldColumns | None = None


@dataclass
class PreparedBatch:
    """A batch ready for its forward.

    Attributes:
        batch: the events, their messages and checkpoint.
        enrichment: their Redis features.
        staged: dense tensor + KJT on (or being copied to) the model's device.
        prepare_s: seconds its enrich and features took.
    """

    batch: Batch
    enrichment: Enrichment
    staged: StagedInput
    prepare_s: float = 0.0


@dataclass
class ScoredBatch:
    """Top-K of every event of a batch, in item ids (flat, event-major, best first).

    Attributes:
        counts: int64[E] items per event.
        item_ids: int64[counts.sum()].
        scores: float64[counts.sum()].
        model_version: of the model that scored the batch.
        forward_s: seconds its forward and top-K took.
        task_scores: float32[counts.sum(), P] the kept items' published task columns (a
            configured output schema's task scores, in ``OutputConfig.task_columns`` order);
            ``None`` when none are published.
    """

    counts: Int64Array
    item_ids: Int64Array
    scores: npt.NDArray[np.float64]
    model_version: str
    forward_s: float = 0.0
    task_scores: npt.NDArray[np.float32] | None = None


class Shutdown:
    """Whether a stop was asked for, and by when every wait must end.

    Args:
        timeout_s: from the request to the deadline (``shutdown.timeout_s``).
        clock: monotonic seconds (tests pass a fake one, shared with the waits they drive).

    Example::

        shutdown = Shutdown(10.0)
        shutdown.request()          # e.g. from a SIGTERM handler
        shutdown.deadline           # time.monotonic() + 10 at the first request
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._requested = threading.Event()
        self._deadline: float | None = None

    def request(self) -> None:
        """Ask for a stop (thread and signal safe); the first request sets the deadline."""
        if not self._requested.is_set():
            self._deadline = self._clock() + self.timeout_s
        self._requested.set()

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    @property
    def deadline(self) -> float | None:
        """``time.monotonic()`` by which every wait must end; ``None`` before a request."""
        return self._deadline
