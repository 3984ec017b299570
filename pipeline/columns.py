"""Decoded events as numpy columns (:class:`EventColumns`), the unit every stage passes on.

Re-exported by :mod:`pipeline.types` (the types between the stages); kept apart so that the
column bookkeeping (slicing, reordering and joining jagged columns in step) has a module of its
own. Every per-event column is listed once in :data:`EVENT_COLUMNS` and every per-row column
in :data:`ROW_COLUMNS`, so :meth:`EventColumns.slice`, :meth:`EventColumns.take` and
:meth:`EventColumns.concat` cannot forget one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from model.features.segments import offsets, starts, take_segments

__all__ = ["EVENT_COLUMNS", "ROW_COLUMNS", "EventColumns", "FieldColumns"]

Int64Array = npt.NDArray[np.int64]

EVENT_COLUMNS = (
    "user_ids",
    "event_time_ms",
    "device_ids",
    "country_ids",
    "num_results",
    "candidate_counts",
    "recent_counts",
    "retrieved",
)
"""Columns with one entry per event."""

ROW_COLUMNS = {"candidate_ids": "candidate_counts", "recent_ids": "recent_counts"}
"""Jagged columns, event-major, and the per-event column holding each event's length."""


@dataclass
class FieldColumns:
    """Configured fields of ``n`` entities (events, users or candidate items), as columns.

    What the feature map (:mod:`model.features.mapping`) reads besides the built-in columns: an
    event's fields of a user's schema, or the fields of a user's or item's Redis record. A value
    that is absent (a null event field; a Redis record, or its field, missing or malformed) is
    marked so: ``False`` in ``int_present`` / ``list_present`` (its ints are 0, its list empty),
    NaN in ``floats``.

    Attributes:
        ints: int64[n, I] single ids (a string field holds its 64-bit hash).
        floats: float32[n, F] numbers (a vector field spans several columns); NaN where absent.
        list_counts: int64[n, L] ids in each of the ``L`` id lists of each entity.
        list_ids: int64[list_counts.sum()], entity-major, an entity's lists one after another.
        int_present: bool[n, I] whether each single id is present.
        list_present: bool[n, L] whether each list is present (an empty list is present).
        raw_counts: int64[n, W] bytes of each of the ``W`` raw fields of each entity: event
            fields carried into the output as their Avro encoding (``[output].echo``); 0 when
            null. Default: none (``W = 0``).
        raw_present: uint8[n, W] 1 where the raw field is not null.
        raw_bytes: uint8[raw_counts.sum()], entity-major, an entity's raw fields one after
            another.
        list_weights: float32[len(list_ids)], each list id's weight (a weighted key's list);
            ``None``: every weight is 1.0.

    Example::

        fields = FieldColumns.empty(3, ints=1, floats=2, lists=1)
        fields.list_starts(0)  # where each entity's first list starts in list_ids
    """

    ints: Int64Array
    floats: npt.NDArray[np.float32]
    list_counts: Int64Array
    list_ids: Int64Array
    int_present: npt.NDArray[np.bool_]
    list_present: npt.NDArray[np.bool_]
    raw_counts: Int64Array = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    raw_present: npt.NDArray[np.uint8] = field(
        default_factory=lambda: np.zeros((0, 0), dtype=np.uint8)
    )
    raw_bytes: npt.NDArray[np.uint8] = field(default_factory=lambda: np.zeros(0, dtype=np.uint8))
    list_weights: npt.NDArray[np.float32] | None = None

    def __post_init__(self) -> None:
        if len(self.raw_counts) != len(self.ints):  # no raw fields given: none
            self.raw_counts = np.zeros((len(self.ints), 0), dtype=np.int64)
            self.raw_present = np.zeros((len(self.ints), 0), dtype=np.uint8)

    @classmethod
    def empty(
        cls, n: int, ints: int = 0, floats: int = 0, lists: int = 0, raw: int = 0
    ) -> FieldColumns:
        """``n`` entities of zeros, empty lists and null raw fields, every id and list present."""
        return cls(
            np.zeros((n, ints), dtype=np.int64),
            np.zeros((n, floats), dtype=np.float32),
            np.zeros((n, lists), dtype=np.int64),
            np.zeros(0, dtype=np.int64),
            np.ones((n, ints), dtype=bool),
            np.ones((n, lists), dtype=bool),
            np.zeros((n, raw), dtype=np.int64),
            np.zeros((n, raw), dtype=np.uint8),
        )

    def __len__(self) -> int:
        return len(self.ints)

    def list_starts(self, which: int) -> Int64Array:
        """int64[n]: where list ``which`` of each entity starts in :attr:`list_ids`."""
        return starts(self.list_counts.sum(axis=1)) + self.list_counts[:, :which].sum(axis=1)

    def slice(self, start: int, stop: int) -> FieldColumns:
        """Entities ``start:stop`` (views)."""
        per_entity = self.list_counts.sum(axis=1)
        first = int(per_entity[:start].sum())
        last = first + int(per_entity[start:stop].sum())
        raw = self.raw_counts.sum(axis=1)
        raw_first = int(raw[:start].sum())
        raw_last = raw_first + int(raw[start:stop].sum())
        return FieldColumns(
            self.ints[start:stop],
            self.floats[start:stop],
            self.list_counts[start:stop],
            self.list_ids[first:last],
            self.int_present[start:stop],
            self.list_present[start:stop],
            self.raw_counts[start:stop],
            self.raw_present[start:stop],
            self.raw_bytes[raw_first:raw_last],
            list_weights=None if self.list_weights is None else self.list_weights[first:last],
        )

    def take(self, order: Int64Array) -> FieldColumns:
        """Entities ``order``, in that order."""
        per_entity = self.list_counts.sum(axis=1)
        segments = take_segments(per_entity, order)
        return FieldColumns(
            self.ints[order],
            self.floats[order],
            self.list_counts[order],
            self.list_ids[segments],
            self.int_present[order],
            self.list_present[order],
            self.raw_counts[order],
            self.raw_present[order],
            self.raw_bytes[take_segments(self.raw_counts.sum(axis=1), order)],
            list_weights=None if self.list_weights is None else self.list_weights[segments],
        )

    def weights(self) -> npt.NDArray[np.float32]:
        """:attr:`list_weights`, or 1.0 for every list id when there are none."""
        if self.list_weights is None:
            return np.ones(len(self.list_ids), dtype=np.float32)
        return self.list_weights

    @classmethod
    def concat(cls, parts: list[FieldColumns]) -> FieldColumns:
        """The entities of ``parts`` one after the other."""
        joined = cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in _FIELD_ARRAYS))
        if any(p.list_weights is not None for p in parts):
            joined.list_weights = np.concatenate([p.weights() for p in parts])
        return joined


_FIELD_ARRAYS = (
    "ints", "floats", "list_counts", "list_ids", "int_present", "list_present",
    "raw_counts", "raw_present", "raw_bytes",
)  # fmt: skip


@dataclass
class EventColumns:
    """Decoded events as columns: ``E`` events, ``R = candidate_counts.sum()`` rows.

    Attributes:
        event_id_bytes: uint8, every ``event_id`` in UTF-8, back to back.
        event_id_offsets: int64[E + 1], where each event id starts in ``event_id_bytes``.
        user_ids: int64[E].
        event_time_ms: int64[E], ``UserEvent.event_time`` in epoch milliseconds.
        device_ids / country_ids: int64[E], the context strings hashed
            (:func:`model.features.spec.string_to_id`).
        num_results: int64[E].
        candidate_counts: int64[E]; 0 right after decoding marks an event that asks for
            retrieval (``[retrieval]``), which gets its candidates before batching.
        candidate_ids: int64[R], event-major.
        recent_counts: int64[E], lengths of the (already capped) ``recent_item_ids``.
        recent_ids: int64[recent_counts.sum()], event-major, newest first within an event.
        retrieved: bool[E], whether the event's candidates came from the retrieval index
            (``Recommendation.retrieved``); False as decoded.
        fields: the configured event fields a user's feature map reads (:class:`FieldColumns`);
            ``None`` for the built-in schema (its columns above are all there is).

    Example::

        first_two = columns.slice(0, 2)
        columns.event_ids()  # ["ev-1", "ev-2", ...] (decodes: for logs and tests)
    """

    event_id_bytes: npt.NDArray[np.uint8]
    event_id_offsets: Int64Array
    user_ids: Int64Array
    event_time_ms: Int64Array
    device_ids: Int64Array
    country_ids: Int64Array
    num_results: Int64Array
    candidate_counts: Int64Array
    candidate_ids: Int64Array
    recent_counts: Int64Array
    recent_ids: Int64Array
    retrieved: npt.NDArray[np.bool_]
    fields: FieldColumns | None = None

    @property
    def num_events(self) -> int:
        return len(self.user_ids)

    @property
    def num_rows(self) -> int:
        return len(self.candidate_ids)

    def event_ids(self) -> list[str]:
        """The event ids as strings (one Python object per event: not for the hot path)."""
        data = self.event_id_bytes.tobytes()
        bounds = self.event_id_offsets.tolist()
        return [data[a:b].decode() for a, b in itertools.pairwise(bounds)]

    def slice(self, start: int, stop: int | None = None) -> EventColumns:
        """Events ``start:stop`` (views, no copies)."""
        start, stop, _ = slice(start, stop).indices(self.num_events)
        stop = max(start, stop)
        ids = self.event_id_offsets
        columns: dict[str, npt.NDArray[np.generic]] = {
            name: getattr(self, name)[start:stop] for name in EVENT_COLUMNS
        }
        for name, lengths in ROW_COLUMNS.items():
            counts = getattr(self, lengths)  # two partial sums, no offsets array per column
            first = int(counts[:start].sum())
            columns[name] = getattr(self, name)[first : first + int(counts[start:stop].sum())]
        return EventColumns(
            event_id_bytes=self.event_id_bytes[int(ids[start]) : int(ids[stop])],
            event_id_offsets=ids[start : stop + 1] - ids[start],
            **columns,  # type: ignore[arg-type]
            fields=self.fields.slice(start, stop) if self.fields is not None else None,
        )

    def take(self, order: Int64Array) -> EventColumns:
        """The events ``order`` (indices into this batch), in that order."""
        id_lengths = np.diff(self.event_id_offsets)
        columns: dict[str, npt.NDArray[np.generic]] = {
            name: getattr(self, name)[order] for name in EVENT_COLUMNS
        }
        for name, lengths in ROW_COLUMNS.items():
            columns[name] = getattr(self, name)[take_segments(getattr(self, lengths), order)]
        return EventColumns(
            event_id_bytes=self.event_id_bytes[take_segments(id_lengths, order)],
            event_id_offsets=offsets(id_lengths[order]),
            **columns,  # type: ignore[arg-type]
            fields=self.fields.take(order) if self.fields is not None else None,
        )

    @classmethod
    def concat(cls, parts: list[EventColumns]) -> EventColumns:
        """The events of ``parts`` one after the other."""
        if len(parts) == 1:
            return parts[0]
        id_lengths = np.concatenate([np.diff(p.event_id_offsets) for p in parts])
        names = (*EVENT_COLUMNS, *ROW_COLUMNS)
        fields = [p.fields for p in parts if p.fields is not None]
        if fields and len(fields) != len(parts):
            raise ValueError("cannot join events with configured fields and events without")
        return cls(
            event_id_bytes=np.concatenate([p.event_id_bytes for p in parts]),
            event_id_offsets=offsets(id_lengths),
            **{name: np.concatenate([getattr(p, name) for p in parts]) for name in names},
            fields=FieldColumns.concat(fields) if fields else None,
        )
