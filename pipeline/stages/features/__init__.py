"""Features: a batch's events and enrichment -> the model's input, staged for the device.

=================  ===================================================================
module             job
=================  ===================================================================
``builtin``        the built-in DLRM's fixed features (compiled layout kernel)
``mapped``         a configured model's feature map (``[features]``), numpy
=================  ===================================================================

Either is a :class:`FeatureStager`; the loop is given one of them (:mod:`pipeline.models.inputs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from pipeline.stages.features.builtin import BuiltinFeatures, build_feature_columns
from pipeline.stages.features.mapped import MappedFeatures
from pipeline.types import Enrichment, EventColumns

if TYPE_CHECKING:
    from model.serving import Scorer
    from model.serving.transfer import StagedInput

__all__ = ["BuiltinFeatures", "FeatureStager", "MappedFeatures", "build_feature_columns"]


class FeatureStager(Protocol):
    """What the batch processor needs: a batch's model input, on its way to the device."""

    def stage(
        self, events: EventColumns, enrichment: Enrichment, scorer: Scorer
    ) -> StagedInput: ...
