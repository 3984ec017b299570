"""The ``recent_items`` rule, shared by serving (``pipeline.stages.features``) and training data.

An event's recent list is its own ``recent_item_ids`` in order (none if null), followed by the
user's stored recent items (Redis ``recent``) in order, truncated to the first ``cap`` items.
Duplicates are kept.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from model.features.segments import Int64Array, positions, starts, take_segments

__all__ = ["merge_recent_items"]


def merge_recent_items(
    event_counts: npt.ArrayLike,
    event_ids: npt.ArrayLike,
    stored_counts: npt.ArrayLike,
    stored_ids: npt.ArrayLike,
    cap: int,
) -> tuple[Int64Array, Int64Array]:
    """Per event: the event's recent items, then the stored ones, the first ``cap`` of them.

    Vectorised: index arithmetic over the two flat sources places the kept items.

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
    ev_counts = np.asarray(event_counts, dtype=np.int64)
    st_counts = np.asarray(stored_counts, dtype=np.int64)
    ev_flat = np.asarray(event_ids, dtype=np.int64)
    st_flat = np.asarray(stored_ids, dtype=np.int64)
    ev_keep = np.minimum(ev_counts, cap)
    st_keep = np.minimum(st_counts, cap - ev_keep)
    counts = ev_keep + st_keep
    out = np.empty(int(counts.sum()), dtype=np.int64)
    out_starts = starts(counts)
    events = np.arange(ev_counts.shape[0], dtype=np.int64)
    out[take_segments(counts, events, ev_keep)] = ev_flat[take_segments(ev_counts, events, ev_keep)]
    out[np.repeat(out_starts + ev_keep, st_keep) + positions(st_keep)] = st_flat[
        take_segments(st_counts, events, st_keep)
    ]
    return counts, out
