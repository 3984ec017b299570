"""Features: a batch's event columns plus its enrichment -> the ranker's input columns.

The rule for ``recent_items`` (shared with training: ``model.recent_items``):
the event's ``recent_item_ids`` in order, then the user's stored recent items in order,
truncated to ``spec.recent_items_cap``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from model.features import FeatureColumns
from model.recent_items import merge_recent_items
from model.segments import flatten, starts
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
    event_starts = starts(events.candidate_counts)
    item_any = (
        np.logical_or.reduceat(enrichment.item_missing, event_starts)
        if len(event_starts)
        else event_starts
    )
    return FallbackFlags(user=enrichment.user_missing.copy(), item=item_any.astype(bool))


def merge_recent(
    event_counts: npt.NDArray[np.int64],
    event_ids: npt.NDArray[np.int64],
    stored_recent: list[npt.NDArray[np.int64]],
    cap: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per event, event recent items then stored ones, capped. Returns (counts, flat ids).

    The rule is :func:`model.recent_items.merge_recent_items`; this flattens the stored lists.
    """
    return merge_recent_items(event_counts, event_ids, *flatten(stored_recent), cap)


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
        events.recent_counts, events.recent_ids, enrichment.user_recent, spec.recent_items_cap
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
