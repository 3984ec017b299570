"""The built-in model's features: a batch's event columns plus its enrichment -> the ranker's
input columns (laid out by the compiled kernel of :mod:`model.features.build`).

The rule for ``recent_items`` (shared with training: ``model.features.recent_items``): the event's
``recent_item_ids`` in order, then the user's stored recent items in order, truncated to
``spec.recent_items_cap``.

Example::

    columns = build_feature_columns(batch.events, enrichment, scorer.spec)
    staged = scorer.stage(columns)  # dense tensor + KJT, on its way to the model's device
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from model.features.build import FeatureColumns
from model.features.recent_items import merge_recent_items
from model.features.spec import FeatureSpec
from pipeline.types import Enrichment, EventColumns

if TYPE_CHECKING:
    from model.serving import Scorer
    from model.serving.transfer import StagedInput

__all__ = ["BuiltinFeatures", "build_feature_columns"]


class BuiltinFeatures:
    """The built-in model's input: its feature columns, laid out and staged by the scorer.

    Example::

        staged = BuiltinFeatures().stage(batch.events, enrichment, scorer)
    """

    def __init__(self) -> None:
        # Load (or compile) the recent-items kernel now, with arrays of the kinds a batch
        # passes (writable int64), so that the first batch does not wait for it.
        merge_recent_items([0], [], [0], [], 0)

    def stage(self, events: EventColumns, enrichment: Enrichment, scorer: Scorer) -> StagedInput:
        """The batch's model input on its way to ``scorer``'s device (``scorer.spec``'s
        layout: the served version's table sizes)."""
        return scorer.stage(build_feature_columns(events, enrichment, scorer.spec))


def build_feature_columns(
    events: EventColumns, enrichment: Enrichment, spec: FeatureSpec
) -> FeatureColumns:
    """The ranker's input columns for a batch (no per-row Python work).

    Args:
        events: decoded events as columns.
        enrichment: their Redis features, aligned with events and rows.
        spec: the served model's feature spec (for the recent-items cap).

    Returns:
        ``model.features.build.FeatureColumns`` ready for
        ``model.features.build.build_model_input``.
    """
    recent_counts, recent_ids = merge_recent_items(
        events.recent_counts,
        events.recent_ids,
        enrichment.user_recent_counts,
        enrichment.user_recent_ids,
        spec.recent_items_cap,
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
