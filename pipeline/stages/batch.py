"""Dynamic micro-batching of decoded events, and their conversion to numpy columns.

A batch closes when the next event would push it past ``max_batch_rows`` rows (rows are
event x candidate pairs; an event is never split), when it reaches ``max_batch_rows``, or when
its oldest event has waited ``max_delay_ms``, whichever comes first. Memory in flight is bounded
by ``max_batch_rows`` (plus one event) here and by the checkpointer's sealed-batch limit after.
"""

from __future__ import annotations

import datetime
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from model.segments import take_segments
from model.spec import string_to_id
from pipeline.stages.decode import Record

Position = tuple[str, int, int]
"""(topic, partition, offset) of a consumed message."""

_STRING_IDS: dict[str, int] = {}
_STRING_IDS_MAX = 100_000


def categorical_id(value: str) -> int:
    """``model.spec.string_to_id`` behind a small cache (devices and countries repeat)."""
    cached = _STRING_IDS.get(value)
    if cached is None:
        if len(_STRING_IDS) >= _STRING_IDS_MAX:
            _STRING_IDS.clear()
        cached = _STRING_IDS[value] = string_to_id(value)
    return cached


@dataclass
class EventColumns:
    """A batch of decoded events as columns (E events, R = sum of candidates rows).

    Attributes:
        event_ids: per event, ``UserEvent.event_id``.
        user_ids: int64[E].
        event_time_ms: int64[E], ``UserEvent.event_time`` in epoch milliseconds.
        device_ids / country_ids: int64[E], hashed context strings.
        num_results: int64[E].
        candidate_counts: int64[E].
        candidate_ids: int64[R], event-major.
        recent_counts: int64[E], lengths of the (already capped) ``recent_item_ids``.
        recent_ids: int64[sum(recent_counts)], event-major, newest first within an event.
        messages: per event, the consumed Kafka message it came from (the loop fills it: a
            poison event is dead-lettered as that message, untouched); empty elsewhere.
    """

    event_ids: list[str]
    user_ids: npt.NDArray[np.int64]
    event_time_ms: npt.NDArray[np.int64]
    device_ids: npt.NDArray[np.int64]
    country_ids: npt.NDArray[np.int64]
    num_results: npt.NDArray[np.int64]
    candidate_counts: npt.NDArray[np.int64]
    candidate_ids: npt.NDArray[np.int64]
    recent_counts: npt.NDArray[np.int64]
    recent_ids: npt.NDArray[np.int64]
    messages: list[Any] = field(default_factory=list)

    @property
    def num_events(self) -> int:
        return len(self.event_ids)

    @classmethod
    def concat(cls, parts: list[EventColumns]) -> EventColumns:
        """The events of ``parts`` one after the other."""
        return cls(
            event_ids=[e for p in parts for e in p.event_ids],
            **{name: np.concatenate([getattr(p, name) for p in parts]) for name in ARRAY_FIELDS},
            messages=[m for p in parts for m in p.messages],
        )

    def head(self, count: int) -> EventColumns:
        """The first ``count`` events (views, no copy)."""
        if count >= self.num_events:
            return self
        rows = int(self.candidate_counts[:count].sum())
        recent = int(self.recent_counts[:count].sum())
        return EventColumns(
            event_ids=self.event_ids[:count],
            user_ids=self.user_ids[:count],
            event_time_ms=self.event_time_ms[:count],
            device_ids=self.device_ids[:count],
            country_ids=self.country_ids[:count],
            num_results=self.num_results[:count],
            candidate_counts=self.candidate_counts[:count],
            candidate_ids=self.candidate_ids[:rows],
            recent_counts=self.recent_counts[:count],
            recent_ids=self.recent_ids[:recent],
            messages=self.messages[:count],
        )

    def take(self, order: npt.NDArray[np.int64]) -> EventColumns:
        """The events ``order`` (indices into this batch), in that order."""
        return EventColumns(
            event_ids=[self.event_ids[i] for i in order.tolist()],
            user_ids=self.user_ids[order],
            event_time_ms=self.event_time_ms[order],
            device_ids=self.device_ids[order],
            country_ids=self.country_ids[order],
            num_results=self.num_results[order],
            candidate_counts=self.candidate_counts[order],
            candidate_ids=self.candidate_ids[take_segments(self.candidate_counts, order)],
            recent_counts=self.recent_counts[order],
            recent_ids=self.recent_ids[take_segments(self.recent_counts, order)],
            messages=[self.messages[i] for i in order.tolist()] if self.messages else [],
        )

    @property
    def num_rows(self) -> int:
        return len(self.candidate_ids)


ARRAY_FIELDS = (  # the int64 columns of EventColumns
    "user_ids",
    "event_time_ms",
    "device_ids",
    "country_ids",
    "num_results",
    "candidate_counts",
    "candidate_ids",
    "recent_counts",
    "recent_ids",
)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MILLISECOND = datetime.timedelta(milliseconds=1)


def epoch_millis(value: int | datetime.datetime) -> int:
    """fastavro decodes timestamp-millis to an aware datetime; exact integer milliseconds."""
    if isinstance(value, int):
        return value
    return (value - _EPOCH) // _MILLISECOND


def to_columns(records: list[Record]) -> EventColumns:
    """Columns straight from decoded records: one pass per field, no per-row Python objects."""
    n = len(records)
    counts = np.fromiter((len(r["candidate_item_ids"]) for r in records), np.int64, n)
    candidate_ids = np.fromiter(
        itertools.chain.from_iterable(r["candidate_item_ids"] for r in records),
        np.int64,
        int(counts.sum()),
    )
    recent_counts = np.fromiter((len(r["recent_item_ids"]) for r in records), np.int64, n)
    return EventColumns(
        event_ids=[r["event_id"] for r in records],
        user_ids=np.fromiter((r["user_id"] for r in records), np.int64, n),
        event_time_ms=np.fromiter((epoch_millis(r["event_time"]) for r in records), np.int64, n),
        device_ids=np.fromiter(
            (categorical_id(r["context"]["device"]) for r in records), np.int64, n
        ),
        country_ids=np.fromiter(
            (categorical_id(r["context"]["country"]) for r in records), np.int64, n
        ),
        num_results=np.fromiter((r["num_results"] for r in records), np.int64, n),
        candidate_counts=counts,
        candidate_ids=candidate_ids,
        recent_counts=recent_counts,
        recent_ids=np.fromiter(
            itertools.chain.from_iterable(r["recent_item_ids"] for r in records),
            np.int64,
            int(recent_counts.sum()),
        ),
    )


class MicroBatcher:
    """Collects decoded event columns into batches bounded by rows and by delay.

    Args:
        max_rows: rows (event x candidate) per batch.
        max_delay_ms: longest the oldest event waits.

    Example::

        batcher = MicroBatcher(max_rows=4096, max_delay_ms=20)
        k = batcher.room(decoded.candidate_counts)
        batcher.add(decoded.take(np.arange(k)), sources[:k])
        if k < decoded.num_events:
            batcher.hold()  # the next event opens the next batch
        if batcher.ready():
            score(batcher.close())
    """

    def __init__(self, max_rows: int, max_delay_ms: float) -> None:
        self.max_rows = max_rows
        self.max_delay_s = max_delay_ms / 1000
        self._parts: list[EventColumns] = []
        self._sources: list[tuple[str, int]] = []
        self._rows = 0
        self._oldest = 0.0
        self._complete = False

    def __len__(self) -> int:
        return len(self._sources)

    @property
    def rows(self) -> int:
        return self._rows

    def room(self, candidate_counts: npt.NDArray[np.int64]) -> int:
        """How many of the next events (their candidate counts, in order) fit the open batch.

        An empty batch takes at least one event (one event larger than ``max_rows`` is a batch
        alone); an event is never split.
        """
        if self._complete:
            return 0
        total = self._rows + np.cumsum(candidate_counts)
        fit = int(np.searchsorted(total, self.max_rows, side="right"))
        return max(fit, 1) if not self._sources and len(candidate_counts) else fit

    def add(
        self, events: EventColumns, sources: list[tuple[str, int]], now: float | None = None
    ) -> None:
        """Add events to the open batch (check :meth:`room` first).

        Args:
            events: decoded events, in consumption order.
            sources: per event, its (topic, partition), so a revoked partition's events can be
                dropped.
            now: monotonic time of arrival (default: now).
        """
        if not events.num_events:
            return
        if not self._sources:
            self._oldest = time.monotonic() if now is None else now
        self._parts.append(events)
        self._sources.extend(sources)
        self._rows += events.num_rows

    def hold(self) -> None:
        """The next event did not fit: the open batch is complete (it waits in the source)."""
        self._complete = True

    @property
    def holding(self) -> bool:
        """Whether the next event waits for the next batch (the open one is then complete)."""
        return self._complete

    def drop_partitions(self, partitions: set[tuple[str, int]]) -> int:
        """Remove the events of ``partitions`` from the open batch.

        Returns:
            How many events were removed.
        """
        keep = [i for i, src in enumerate(self._sources) if src not in partitions]
        dropped = len(self._sources) - len(keep)
        if dropped:
            batch = EventColumns.concat(self._parts).take(np.asarray(keep, dtype=np.int64))
            self._parts = [batch] if keep else []
            self._sources = [self._sources[i] for i in keep]
            self._rows = batch.num_rows
            self._complete = False  # rows were freed: the next event may fit now
        return dropped

    @property
    def full(self) -> bool:
        return self._rows >= self.max_rows

    def ready(self, now: float | None = None) -> bool:
        """Whether the open batch should be scored now: full, complete, or due."""
        return self.full or self._complete or self.due(now)

    def time_left(self, now: float | None = None) -> float:
        """Seconds until the open batch is due (``inf`` when empty)."""
        if not self._sources:
            return float("inf")
        now = time.monotonic() if now is None else now
        return max(0.0, self._oldest + self.max_delay_s - now)

    def due(self, now: float | None = None) -> bool:
        """Whether the oldest event has waited ``max_delay_ms``."""
        return bool(self._sources) and self.time_left(now) <= 0.0

    def close(self) -> EventColumns | None:
        """Take the open batch (``None`` when empty)."""
        if not self._sources:
            self._complete = False
            return None
        parts = self._parts
        self._parts, self._sources, self._rows, self._complete = [], [], 0, False
        return parts[0] if len(parts) == 1 else EventColumns.concat(parts)
