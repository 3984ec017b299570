"""Features: a batch's event columns plus its enrichment -> the ranker's input columns.

The rule for ``recent_items`` (shared with training, see ``model.synthetic.feature_columns``):
the event's ``recent_item_ids`` in order, then the user's stored recent items in order,
truncated to ``spec.recent_items_cap``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from model.features import FeatureColumns
from model.spec import FeatureSpec
from pipeline.stages.batch import EventColumns
from pipeline.stages.enrich import Enrichment, FallbackFeature


@dataclass
class FallbackFlags:
    """Per event: which feature groups fell back to defaults."""

    user: npt.NDArray[np.bool_]
    item: npt.NDArray[np.bool_]

    def names(self, event: int) -> list[str]:
        """The ``fallback_features`` list of one event's Recommendation."""
        out = []
        if self.user[event]:
            out.append(FallbackFeature.USER.value)
        if self.item[event]:
            out.append(FallbackFeature.ITEM.value)
        return out


def fallback_flags(events: EventColumns, enrichment: Enrichment) -> FallbackFlags:
    """Per-event flags; an event's item flag is set when any of its candidates fell back."""
    starts = np.concatenate(([0], np.cumsum(events.candidate_counts)[:-1]))
    item_any = np.logical_or.reduceat(enrichment.item_missing, starts) if len(starts) else starts
    return FallbackFlags(user=enrichment.user_missing.copy(), item=item_any.astype(bool))


def _starts(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Exclusive prefix sum: where each segment starts in a flat array."""
    return np.cumsum(counts) - counts


def _positions(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Each element's position inside its segment (0, 1, ... per segment)."""
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(_starts(counts), counts)


def merge_recent(
    event_recent: list[list[int]], stored_recent: list[npt.NDArray[np.int64]], cap: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per event, event recent items then stored ones, capped. Returns (counts, flat ids).

    Vectorised: both sources are flattened once, and index arithmetic places the kept items.
    """
    n = len(event_recent)
    ev_counts = np.fromiter(map(len, event_recent), np.int64, n)
    ev_flat = np.fromiter(itertools.chain.from_iterable(event_recent), np.int64, ev_counts.sum())
    st_counts = np.fromiter((s.size for s in stored_recent), np.int64, n)
    st_flat = np.concatenate(stored_recent).astype(np.int64, copy=False) if n else ev_flat[:0]
    ev_keep = np.minimum(ev_counts, cap)
    st_keep = np.minimum(st_counts, cap - ev_keep)
    counts = ev_keep + st_keep
    out = np.empty(int(counts.sum()), dtype=np.int64)
    out_starts = _starts(counts)
    ev_taken = ev_flat[_positions(ev_counts) < np.repeat(ev_keep, ev_counts)]
    st_taken = st_flat[_positions(st_counts) < np.repeat(st_keep, st_counts)]
    out[np.repeat(out_starts, ev_keep) + _positions(ev_keep)] = ev_taken
    out[np.repeat(out_starts + ev_keep, st_keep) + _positions(st_keep)] = st_taken
    return counts, out


def build_feature_columns(
    events: EventColumns, enrichment: Enrichment, spec: FeatureSpec
) -> FeatureColumns:
    """The ranker's input columns for a batch (no per-row Python work).

    Args:
        events: decoded events as columns.
        enrichment: their Redis features, aligned with events and rows.
        spec: the served model's feature spec (for the recent-items cap).

    Returns:
        ``model.features.FeatureColumns`` ready for ``model.features.build_model_input``.
    """
    recent_counts, recent_ids = merge_recent(
        events.event_recent, enrichment.user_recent, spec.recent_items_cap
    )
    return FeatureColumns(
        user_ids=events.user_ids,
        device_ids=events.device_ids,
        country_ids=events.country_ids,
        candidate_counts=events.candidate_counts,
        candidate_ids=events.candidate_ids,
        recent_counts=recent_counts,
        recent_ids=recent_ids,
        user_dense=enrichment.user_dense,
        item_category=enrichment.item_category,
        item_dense=enrichment.item_dense,
    )
