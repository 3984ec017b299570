"""A batch of sampled synthetic events, as numpy columns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from model.features.segments import Int64Array

__all__ = ["SampledEvents"]


@dataclass
class SampledEvents:
    """A batch of synthetic events as numpy columns (indices into the world's arrays).

    ``E`` events, ``R = candidate_counts.sum()`` candidate rows, event-major.

    Args:
        user_index: int64[E] user of each event.
        device_index: int64[E] index into ``WorldConfig.devices``.
        country_index: int64[E] index into ``WorldConfig.countries``.
        candidate_counts: int64[E] candidates per event.
        candidate_items: int64[R] candidate item indices (distinct within an event).
        has_recent: bool[E] whether the event carries ``recent_item_ids`` (else ``None``).
        recent_counts: int64[E] the event's own recent items (0 where ``has_recent`` is False).
        recent_items: int64[recent_counts.sum()] the event's recent item indices.
        num_results: int64[E] results requested.
        event_time_ms: int64[E] event time, epoch milliseconds, non-decreasing.
        event_id_bits: uint64[E, 2] the 128 bits of each event id.
    """

    user_index: Int64Array
    device_index: Int64Array
    country_index: Int64Array
    candidate_counts: Int64Array
    candidate_items: Int64Array
    has_recent: npt.NDArray[np.bool_]
    recent_counts: Int64Array
    recent_items: Int64Array
    num_results: Int64Array
    event_time_ms: Int64Array
    event_id_bits: npt.NDArray[np.uint64]

    @property
    def num_events(self) -> int:
        """``E``."""
        return int(self.user_index.shape[0])

    @property
    def num_rows(self) -> int:
        """``R``."""
        return int(self.candidate_items.shape[0])

    def event_ids(self) -> list[str]:
        """32-hex-digit event ids (deterministic: derived from the sampling generator)."""
        return [f"{int(hi):016x}{int(lo):016x}" for hi, lo in self.event_id_bits]
