"""Columnar decode: a batch of Kafka message values -> validated UserEvent columns.

The compiled kernel (:mod:`pipeline.stages.avro_kernels`) decodes every body in one call; no
dict per event. fastavro (:class:`pipeline.stages.decode.UserEventDecoder`) stays the reference
and is only called for the exceptions: each message the kernel rejects (so the dead letter gets
the reference's reason and detail), and Confluent messages whose writer schema is not our
reader schema (schema resolution is fastavro's job).

Example::

    decoder = ColumnarDecoder(CodecSettings(), recent_cap=20)
    batch = decoder.decode([m.value() for m in messages])
    batch.columns.user_ids, batch.rejections
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipeline.config import CodecSettings, Framing
from pipeline.stages import avro_kernels as k
from pipeline.stages.batch import EventColumns, categorical_id, to_columns
from pipeline.stages.decode import (
    EARLIEST_EVENT_MS,
    RejectedMessage,
    RejectReason,
    UserEventDecoder,
    latest_event_ms,
)

_HEADER = 5  # Confluent: magic byte 0 + 4-byte big-endian schema id


@dataclass
class DecodedBatch:
    """What a batch of messages decoded to.

    Attributes:
        columns: the accepted events, in message order.
        accepted: int64[E], the message index of each accepted event.
        rejections: (message index, why) of every rejected message, in message order.
    """

    columns: EventColumns
    accepted: npt.NDArray[np.int64]
    rejections: list[tuple[int, RejectedMessage]]


class ColumnarDecoder:
    """Bytes of many messages -> :class:`DecodedBatch` (same rules as ``UserEventDecoder``).

    Args:
        settings: framing, registry and validation limits.
        recent_cap: ``recent_item_ids`` beyond this are dropped (newest first are kept).
    """

    def __init__(self, settings: CodecSettings, recent_cap: int) -> None:
        self._settings = settings
        self._recent_cap = recent_cap
        self.reference = UserEventDecoder(settings, recent_cap)
        self._framing = settings.framing
        self._same_schema: dict[int, bool] = {}
        self._categorical: dict[int, int] = {}
        self.kernel([])  # load (or compile) the kernels now, not on the first batch

    def decode(self, values: list[bytes | None]) -> DecodedBatch:
        """Decode and validate ``values`` (one per message, in consumption order)."""
        status, columns = self.kernel(values)
        ok = np.flatnonzero(status == k.STATUS_OK)
        if len(ok) == len(values):
            return DecodedBatch(columns, ok, [])
        return self._with_exceptions(values, status, ok, columns)

    def kernel(self, values: list[bytes | None]) -> tuple[npt.NDArray[np.int8], EventColumns]:
        """The compiled pass alone: per-message ``STATUS_*`` and the accepted events' columns."""
        n = len(values)
        lengths = np.fromiter((len(v) if v else 0 for v in values), np.int64, n)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        buf = np.frombuffer(b"".join(v for v in values if v), dtype=np.uint8)
        status = np.zeros(n, dtype=np.int8)
        status[lengths == 0] = k.STATUS_EMPTY
        status[lengths > self._settings.max_message_bytes] = k.STATUS_OVERSIZED
        if self._framing is Framing.CONFLUENT:
            starts = self._skip_headers(buf, starts, lengths, status)
        limits = self._settings
        ints = np.zeros((n, 3), dtype=np.int64)
        strings = np.zeros((n, 6), dtype=np.int64)
        candidate_counts = np.zeros(n, dtype=np.int64)
        recent_counts = np.zeros(n, dtype=np.int64)
        candidate_ids = np.empty(len(buf), dtype=np.int64)
        recent_ids = np.empty(len(buf), dtype=np.int64)
        n_cand, n_recent = k.decode_user_events(
            buf, starts, ends, status, ints, strings, candidate_counts, candidate_ids,
            recent_counts, recent_ids, limits.max_candidates, limits.max_id,
            limits.max_num_results, self._recent_cap, limits.max_recent_items,
            limits.max_string_length, EARLIEST_EVENT_MS, latest_event_ms(limits),
        )  # fmt: skip
        ok = np.flatnonzero(status == k.STATUS_OK)
        columns = EventColumns(
            event_ids=self._event_ids(buf, strings[ok]),
            user_ids=ints[ok, 0],
            event_time_ms=ints[ok, 1],
            device_ids=self._categorical_ids(buf, strings[ok], 2),
            country_ids=self._categorical_ids(buf, strings[ok], 4),
            num_results=ints[ok, 2],
            candidate_counts=candidate_counts[ok],
            candidate_ids=candidate_ids[:n_cand],
            recent_counts=recent_counts[ok],
            recent_ids=recent_ids[:n_recent],
        )
        return status, columns

    def _skip_headers(
        self,
        buf: npt.NDArray[np.uint8],
        starts: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        status: npt.NDArray[np.int8],
    ) -> npt.NDArray[np.int64]:
        """Confluent framing: bodies start after the header; other schemas take the slow path."""
        framed = (status == k.STATUS_OK) & (lengths >= _HEADER)
        status[(status == k.STATUS_OK) & ~framed] = k.STATUS_SLOW_PATH
        at = starts[framed]
        framed[framed] = buf[at] == 0
        status[(status == k.STATUS_OK) & ~framed] = k.STATUS_SLOW_PATH
        at = starts[framed]
        ids = np.zeros(len(starts), dtype=np.int64)
        for i in range(1, _HEADER):
            ids[framed] = ids[framed] * 256 + buf[at + i]
        for schema_id in np.unique(ids[framed]).tolist():
            if not self._is_reader_schema(schema_id):
                status[framed & (ids == schema_id)] = k.STATUS_SLOW_PATH
        return starts + _HEADER

    def _is_reader_schema(self, schema_id: int) -> bool:
        same = self._same_schema.get(schema_id)
        if same is None:
            same = self._same_schema[schema_id] = self.reference.writer_is_reader(schema_id)
        return same

    def _event_ids(self, buf: npt.NDArray[np.uint8], strings: npt.NDArray[np.int64]) -> list[str]:
        """Event ids as ``str`` (what the Recommendation echoes)."""
        data = buf.tobytes()
        return [data[s : s + n].decode() for s, n in strings[:, :2].tolist()]

    def _categorical_ids(
        self, buf: npt.NDArray[np.uint8], strings: npt.NDArray[np.int64], column: int
    ) -> npt.NDArray[np.int64]:
        """``categorical_id`` of a string column, hashed once per distinct value."""
        keys = k.string_keys(buf, strings, column)
        unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        ids = np.empty(len(unique), dtype=np.int64)
        data = buf.tobytes()
        for u, (key, row) in enumerate(zip(unique.tolist(), first.tolist(), strict=True)):
            cached = self._categorical.get(key)
            if cached is None:
                s, n = strings[row, column], strings[row, column + 1]
                cached = self._categorical[key] = categorical_id(data[s : s + n].decode())
            ids[u] = cached
        return ids[inverse]

    def _with_exceptions(
        self,
        values: list[bytes | None],
        status: npt.NDArray[np.int8],
        ok: npt.NDArray[np.int64],
        columns: EventColumns,
    ) -> DecodedBatch:
        """Ask the reference about every message the kernel did not accept."""
        rejections: list[tuple[int, RejectedMessage]] = []
        slow_index: list[int] = []
        slow_records = []
        for i in np.flatnonzero(status != k.STATUS_OK).tolist():
            try:
                slow_records.append(self.reference.decode(values[i]))
                slow_index.append(i)
            except RejectedMessage as rejection:
                rejections.append((i, rejection))
        if not slow_records:
            return DecodedBatch(columns, ok, rejections)
        merged = EventColumns.concat([columns, to_columns(slow_records)])
        accepted = np.concatenate([ok, np.asarray(slow_index, dtype=np.int64)])
        order = np.argsort(accepted, kind="stable")
        return DecodedBatch(merged.take(order), accepted[order], rejections)


KERNEL_REASONS = {
    k.STATUS_EMPTY: RejectReason.EMPTY,
    k.STATUS_OVERSIZED: RejectReason.OVERSIZED,
    k.STATUS_UNDECODABLE: RejectReason.UNDECODABLE,
    k.STATUS_NO_CANDIDATES: RejectReason.NO_CANDIDATES,
    k.STATUS_TOO_MANY_CANDIDATES: RejectReason.TOO_MANY_CANDIDATES,
    k.STATUS_ID_OUT_OF_RANGE: RejectReason.ID_OUT_OF_RANGE,
    k.STATUS_INVALID_FIELD: RejectReason.INVALID_FIELD,
    k.STATUS_TOO_MANY_RECENT_ITEMS: RejectReason.TOO_MANY_RECENT_ITEMS,
    k.STATUS_INVALID_STRING: RejectReason.INVALID_STRING,
    k.STATUS_INVALID_EVENT_TIME: RejectReason.INVALID_EVENT_TIME,
}
"""The reason each kernel status stands for (the property tests hold the kernel to it)."""
