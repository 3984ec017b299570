"""Decoded events as numpy columns (:class:`EventColumns`), the unit every stage passes on.

Re-exported by :mod:`pipeline.types` (the types between the stages); kept apart so that the
column bookkeeping (slicing, reordering and joining jagged columns in step) has a module of its
own. Every per-event column is listed once in :data:`EVENT_COLUMNS` and every per-row column
in :data:`ROW_COLUMNS`, so :meth:`EventColumns.slice`, :meth:`EventColumns.take` and
:meth:`EventColumns.concat` cannot forget one.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from model.features.segments import offsets, take_segments

__all__ = ["EVENT_COLUMNS", "ROW_COLUMNS", "EventColumns"]

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
        )

    @classmethod
    def concat(cls, parts: list[EventColumns]) -> EventColumns:
        """The events of ``parts`` one after the other."""
        if len(parts) == 1:
            return parts[0]
        id_lengths = np.concatenate([np.diff(p.event_id_offsets) for p in parts])
        names = (*EVENT_COLUMNS, *ROW_COLUMNS)
        return cls(
            event_id_bytes=np.concatenate([p.event_id_bytes for p in parts]),
            event_id_offsets=offsets(id_lengths),
            **{name: np.concatenate([getattr(p, name) for p in parts]) for name in names},
        )
