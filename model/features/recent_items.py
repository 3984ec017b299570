"""The ``recent_items`` rule, shared by serving (``pipeline.stages.features``) and training data.

An event's recent list is its own ``recent_item_ids`` in order (none if null), followed by the
user's stored recent items (Redis ``recent``) in order, truncated to the first ``cap`` items.
Duplicates are kept.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from model.features.segments import Int64Array
from model.kernels import kernel

__all__ = ["merge_recent_items"]


def merge_recent_items(
    event_counts: npt.ArrayLike,
    event_ids: npt.ArrayLike,
    stored_counts: npt.ArrayLike,
    stored_ids: npt.ArrayLike,
    cap: int,
) -> tuple[Int64Array, Int64Array]:
    """Per event: the event's recent items, then the stored ones, the first ``cap`` of them.

    One compiled pass over the two flat sources (no Python work per event).

    Args:
        event_counts: int[E] recent items carried by each event.
        event_ids: int[sum(event_counts)] those items, event-major.
        stored_counts: int[E] stored recent items of each event's user.
        stored_ids: int[sum(stored_counts)] those items, event-major.
        cap: most items kept per event (``FeatureSpec.recent_items_cap``).

    Returns:
        ``(int64[E] counts, int64[sum(counts)] ids)``, event-major.

    Example::

        merge_recent_items([2], [7, 8], [2], [1, 2], cap=3)  # ([3], [7, 8, 1])
    """
    return _merge(
        np.ascontiguousarray(event_counts, dtype=np.int64).reshape(-1),
        np.ascontiguousarray(event_ids, dtype=np.int64).reshape(-1),
        np.ascontiguousarray(stored_counts, dtype=np.int64).reshape(-1),
        np.ascontiguousarray(stored_ids, dtype=np.int64).reshape(-1),
        cap,
    )


@kernel
def _merge(
    event_counts: Int64Array,
    event_ids: Int64Array,
    stored_counts: Int64Array,
    stored_ids: Int64Array,
    cap: int,
) -> tuple[Int64Array, Int64Array]:
    """:func:`merge_recent_items` in one compiled pass (its arguments checked first: the
    loops below index without bounds checks)."""
    num_events = len(event_counts)
    if len(stored_counts) != num_events:
        raise ValueError("event_counts and stored_counts differ in length")
    if (event_counts < 0).any() or (stored_counts < 0).any():
        raise ValueError("negative recent-item counts")
    if event_counts.sum() != len(event_ids) or stored_counts.sum() != len(stored_ids):
        raise ValueError("recent-item counts do not sum to the number of ids")
    keep = max(cap, 0)
    counts = np.empty(num_events, dtype=np.int64)
    total = 0
    for e in range(num_events):
        from_event = min(event_counts[e], keep)
        counts[e] = from_event + min(stored_counts[e], keep - from_event)
        total += counts[e]
    out = np.empty(total, dtype=np.int64)
    w = first_event = first_stored = 0
    for e in range(num_events):
        from_event = min(event_counts[e], keep)
        for j in range(from_event):
            out[w] = event_ids[first_event + j]
            w += 1
        for j in range(counts[e] - from_event):
            out[w] = stored_ids[first_stored + j]
            w += 1
        first_event += event_counts[e]
        first_stored += stored_counts[e]
    return counts, out
