"""Decode: consumed messages -> validated UserEvent columns, or a reject reason per message.

The compiled kernel (:mod:`pipeline.connectors.avro.kernels`) decodes every body of a poll in one
call, no dict per event, applying the rules of :mod:`pipeline.connectors.avro.rules`. The fastavro
reference (:mod:`pipeline.connectors.avro.reference`) is only asked about the exceptions: each
message the kernel rejects (so its dead letter gets the reference's reason and detail) and
Confluent messages whose writer schema is not our reader schema (schema resolution is fastavro's
job). Each message is decoded once; a value over ``codec.max_message_bytes`` is never copied
(it is refused by its length, before the values are laid end to end for the kernel).

Example::

    decoder = MessageDecoder(CodecSettings(), recent_cap=20)
    decoded = decoder.decode(polled)   # a PolledBatch of the input topic
    decoded.events.user_ids, decoded.rejections
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import compress
from typing import cast

import numpy as np
import numpy.typing as npt

from model.features.segments import offsets, positions
from model.features.spec import string_to_id
from pipeline.connectors.avro import framing as wire
from pipeline.connectors.avro import kernels
from pipeline.connectors.avro.reference import ReferenceDecoder, records_to_columns
from pipeline.connectors.avro.rules import (
    EARLIEST_EVENT_MS,
    STATUS_EMPTY,
    STATUS_OK,
    STATUS_OVERSIZED,
    STATUS_SLOW_PATH,
)
from pipeline.settings.codec import CodecSettings, Framing
from pipeline.stages.decode.messages import decoded_messages, value_sizes
from pipeline.types import DecodedMessages, EventColumns, PolledBatch, RejectedMessage

__all__ = ["MessageDecoder"]


class MessageDecoder:
    """Consumed messages -> :class:`~pipeline.types.DecodedMessages`.

    Args:
        settings: framing, registry and validation limits (``[codec]``).
        recent_cap: ``recent_item_ids`` beyond this are dropped (newest first are kept).
        retrieve: accept events without candidates (``retrieval.enabled``: they get retrieved
            ones before batching, :mod:`pipeline.runtime.retrieve`); off: ``no_candidates``.
    """

    def __init__(self, settings: CodecSettings, recent_cap: int, retrieve: bool = False) -> None:
        self.reference = ReferenceDecoder(settings, recent_cap, retrieve)
        self._limits = self.reference.limits
        self._framing = settings.framing
        self._same_schema: dict[int, bool] = {}
        self._categorical: dict[int, int] = {}
        """FNV-1a key of a context string's bytes -> :func:`model.features.spec.string_to_id`."""
        self.decode_values([])  # load (or compile) the kernels now, not on the first batch

    def decode(self, messages: PolledBatch) -> DecodedMessages:
        """Decode and validate ``messages`` (in consumption order)."""
        return decoded_messages(messages, self.decode_values)

    def decode_values(
        self, values: list[bytes | None], lengths: npt.NDArray[np.int64] | None = None
    ) -> tuple[EventColumns, npt.NDArray[np.int64], list[tuple[int, RejectedMessage]]]:
        """Decode message values (``lengths``: their sizes, -1 for null, when known).

        Returns:
            The accepted events (in message order), int64[E] the index of each one's value, and
            ``(index, why)`` of every rejected value, in order.
        """
        status, events = self.kernel(values, lengths)
        ok = np.flatnonzero(status == STATUS_OK)
        if len(ok) == len(values):
            return events, ok, []
        return self._with_exceptions(values, status, ok, events)

    def kernel(
        self, values: list[bytes | None], lengths: npt.NDArray[np.int64] | None = None
    ) -> tuple[npt.NDArray[np.int8], EventColumns]:
        """The compiled pass: per-value ``STATUS_*`` and the accepted events' columns."""
        n = len(values)
        limits = self._limits
        sizes = value_sizes(values, lengths)
        oversized = sizes > limits.max_message_bytes
        # Oversized values are refused before they are copied: they take no room in ``buf``.
        lengths = np.where(oversized, 0, sizes)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        in_buffer = cast(Iterable[bytes], compress(values, lengths))
        buf = np.frombuffer(b"".join(in_buffer), dtype=np.uint8)
        status = np.zeros(n, dtype=np.int8)
        status[sizes == 0] = STATUS_EMPTY
        status[oversized] = STATUS_OVERSIZED
        if self._framing is Framing.CONFLUENT:
            starts = self._skip_headers(buf, starts, lengths, status)
        ints = np.zeros((n, 3), dtype=np.int64)
        strings = np.zeros((n, 6), dtype=np.int64)
        candidate_counts = np.zeros(n, dtype=np.int64)
        recent_counts = np.zeros(n, dtype=np.int64)
        candidate_ids = np.empty(len(buf), dtype=np.int64)
        recent_ids = np.empty(len(buf), dtype=np.int64)
        n_cand, n_recent = kernels.decode_user_events(
            buf, starts, ends, status, ints, strings, candidate_counts, candidate_ids,
            recent_counts, recent_ids, limits.max_candidates, limits.max_id,
            limits.max_num_results, limits.recent_cap, limits.max_recent_items,
            limits.max_string_length, EARLIEST_EVENT_MS, limits.latest_event_ms(),
            limits.retrieve,
        )  # fmt: skip
        ok = np.flatnonzero(status == STATUS_OK)
        kept = strings[ok]
        id_lengths = kept[:, 1]
        events = EventColumns(
            event_id_bytes=buf[np.repeat(kept[:, 0], id_lengths) + positions(id_lengths)],
            event_id_offsets=offsets(id_lengths),
            user_ids=ints[ok, 0],
            event_time_ms=ints[ok, 1],
            device_ids=self._categorical_ids(buf, kept, 2),
            country_ids=self._categorical_ids(buf, kept, 4),
            num_results=ints[ok, 2],
            candidate_counts=candidate_counts[ok],
            candidate_ids=candidate_ids[:n_cand],
            recent_counts=recent_counts[ok],
            recent_ids=recent_ids[:n_recent],
            retrieved=np.zeros(len(ok), dtype=bool),
        )
        return status, events

    def _skip_headers(
        self,
        buf: npt.NDArray[np.uint8],
        starts: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        status: npt.NDArray[np.int8],
    ) -> npt.NDArray[np.int64]:
        """Confluent framing: bodies start after the header; other writer schemas, and values
        that are not framed, take the reference's path."""
        framed, ids = wire.schema_ids(buf, starts, lengths)
        status[(status == STATUS_OK) & ~framed] = STATUS_SLOW_PATH
        for schema_id in np.unique(ids[framed]).tolist():
            if not self._is_reader_schema(schema_id):
                status[framed & (ids == schema_id)] = STATUS_SLOW_PATH
        return starts + wire.HEADER_BYTES

    def _is_reader_schema(self, schema_id: int) -> bool:
        same = self._same_schema.get(schema_id)
        if same is None:
            same = self._same_schema[schema_id] = self.reference.writer_is_reader(schema_id)
        return same

    def _categorical_ids(
        self, buf: npt.NDArray[np.uint8], strings: npt.NDArray[np.int64], column: int
    ) -> npt.NDArray[np.int64]:
        """:func:`model.features.spec.string_to_id` of a string column, hashed once per distinct
        value."""
        keys = kernels.string_keys(buf, strings, column)
        unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        ids = np.empty(len(unique), dtype=np.int64)
        data = buf.tobytes() if len(unique) else b""
        for u, (key, row) in enumerate(zip(unique.tolist(), first.tolist(), strict=True)):
            cached = self._categorical.get(key)
            if cached is None:
                s, n = strings[row, column], strings[row, column + 1]
                cached = self._categorical[key] = string_to_id(data[s : s + n].decode())
            ids[u] = cached
        return ids[inverse.reshape(-1)]

    def _with_exceptions(
        self,
        values: list[bytes | None],
        status: npt.NDArray[np.int8],
        ok: npt.NDArray[np.int64],
        events: EventColumns,
    ) -> tuple[EventColumns, npt.NDArray[np.int64], list[tuple[int, RejectedMessage]]]:
        """Ask the reference about every value the kernel did not accept."""
        rejections: list[tuple[int, RejectedMessage]] = []
        slow_index: list[int] = []
        slow_records = []
        for i in np.flatnonzero(status != STATUS_OK).tolist():
            try:
                slow_records.append(self.reference.decode(values[i]))
                slow_index.append(i)
            except RejectedMessage as rejection:
                rejections.append((i, rejection))
        if not slow_records:
            return events, ok, rejections
        merged = EventColumns.concat([events, records_to_columns(slow_records)])
        accepted = np.concatenate([ok, np.asarray(slow_index, dtype=np.int64)])
        order = np.argsort(accepted, kind="stable")
        return merged.take(order), accepted[order], rejections
