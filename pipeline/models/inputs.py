"""The stages that read a model's input, chosen once: the built-in trio or the configured one.

=============  ================================  ======================================
stage          built-in DLRM (UserEvent)         configured model (``[model.module]``)
=============  ================================  ======================================
decode         compiled kernels                  fastavro over ``[events]``'s schema
enrich         packed records, one MGET          ``[features.user/item]`` layouts
features       compiled layout kernel            the feature map, numpy
=============  ================================  ======================================

Example::

    inputs = serving_inputs(settings, Metrics())
    decoded = inputs.decoder.decode(polled)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from model.features.mapping import FeatureMap
from pipeline.models.mapping import resolve_feature_map
from pipeline.observability.metrics import Metrics
from pipeline.settings.loading import Settings
from pipeline.stages.decode import ConfiguredDecoder, MessageDecoder
from pipeline.stages.enrich.configured import ConfiguredEnricher
from pipeline.stages.enrich.enricher import BatchEnricher, FeatureEnricher
from pipeline.stages.features import BuiltinFeatures, FeatureStager, MappedFeatures
from pipeline.types import DecodedMessages, EventColumns, PolledBatch, RejectedMessage

if TYPE_CHECKING:
    from model.features.spec import FeatureSpec

__all__ = ["EventDecoder", "ServingInputs", "serving_inputs"]


class EventDecoder(Protocol):
    """What the loop needs of a decoder (:class:`MessageDecoder` or :class:`ConfiguredDecoder`)."""

    def decode(self, messages: PolledBatch) -> DecodedMessages: ...

    def decode_values(
        self, values: list[bytes | None], lengths: npt.NDArray[np.int64] | None = ...
    ) -> tuple[EventColumns, npt.NDArray[np.int64], list[tuple[int, RejectedMessage]]]: ...


@dataclass(frozen=True)
class ServingInputs:
    """The decode, enrich and features stages of one model.

    Attributes:
        decoder: messages -> events.
        enricher: events -> their Redis features.
        features: events + features -> the model input, staged.
        feature_map: the configured model's map; ``None`` for the built-in model.
    """

    decoder: EventDecoder
    enricher: BatchEnricher
    features: FeatureStager
    feature_map: FeatureMap | None = None


def serving_inputs(
    settings: Settings,
    metrics: Metrics,
    spec: FeatureSpec | None = None,
    enricher: BatchEnricher | None = None,
    feature_map: FeatureMap | None = None,
) -> ServingInputs:
    """The stages that read the input of the model ``settings`` serve.

    Args:
        settings: ``[model.module]`` set: the configured trio (``[events]``, ``[features]``);
            else the built-in one for ``spec``.
        metrics: the enricher's cache counters.
        spec: the built-in model's spec (its recent-items cap and dense widths); required
            without ``[model.module]``.
        enricher: a feature source to use instead of Redis (tests).
        feature_map: ``[model.module]``'s feature map as the loader resolved it
            (:class:`pipeline.models.preflight.ConfiguredModel`); default: resolved here.

    Raises:
        FeatureMapError: the feature map does not resolve (one line naming the key).
    """
    retrieve = settings.retrieval.enabled
    if settings.model.module is not None:
        fmap = feature_map or resolve_feature_map(settings)
        return ServingInputs(
            ConfiguredDecoder(settings.codec, fmap, retrieve),
            enricher or ConfiguredEnricher(settings.redis, fmap, metrics),
            MappedFeatures(fmap),
            fmap,
        )
    if spec is None:
        raise ValueError("the built-in model's inputs need its FeatureSpec")
    return ServingInputs(
        MessageDecoder(settings.codec, recent_cap=spec.recent_items_cap, retrieve=retrieve),
        enricher
        or FeatureEnricher(
            settings.redis,
            spec.user_dense_dim,
            spec.item_dense_dim,
            spec.recent_items_cap,
            metrics,
        ),
        BuiltinFeatures(),
    )
