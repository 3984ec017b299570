"""What a benchmark feeds the pipeline: the built-in model's synthetic world, or a configured
model's own input (``[model.module]``: events synthesized from its schema, Redis records from its
layouts, :mod:`pipeline.tools.bench.configured`).

A :class:`Workload` seeds the features once (:func:`workload`), produces events to a topic, and
builds batches of model input the way the serving path builds them (the built-in layout kernel;
for a configured model the configured decode, the configured enricher reading the seeded Redis
records, and the mapped features), for the forward-only timings. The same events one by one,
for a producer that paces them and for the audits: :mod:`pipeline.tools.bench.event_source`.

Example::

    load = workload(settings)                       # seeds Redis
    load.produce(run_settings, 5000)                # a backlog on run_settings.topics.input
    batches = load.batches(scorer.spec if scorer.builtin else scorer.layout, 4096, 16)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from model.features.build import build_model_input
from model.features.layout import InputLayout
from model.features.mapping import FeatureMap
from model.features.model_input import ModelInput
from model.features.spec import FeatureSpec
from model.synthetic import SyntheticWorld
from pipeline.models.preflight import configured_module
from pipeline.observability.metrics import Metrics
from pipeline.settings.codec import Framing
from pipeline.settings.loading import Settings
from pipeline.stages.decode import ConfiguredDecoder
from pipeline.stages.enrich.configured import ConfiguredEnricher
from pipeline.stages.features import MappedFeatures
from pipeline.tools.bench.common import batch_of_rows, seeded_world
from pipeline.tools.bench.configured import seed_layouts
from pipeline.tools.bench.event_source import event_records, produce_records
from pipeline.tools.synthetic_io import build_world, produce_events

__all__ = ["ModelBatch", "Workload", "workload"]


@dataclass(frozen=True)
class ModelBatch:
    """One batch of model input and how many events its rows belong to."""

    model_input: ModelInput
    events: int


class Workload(Protocol):
    """Events and model inputs of the model a benchmark measures."""

    def produce(self, settings: Settings, events: int) -> None:
        """``events`` new events on ``settings.topics.input`` (created if needed)."""
        ...

    def batches(self, inputs: FeatureSpec | InputLayout, rows: int, count: int) -> list[ModelBatch]:
        """``count`` different batches of whole events, at most ``rows`` rows each (at least
        one event), as the serving path lays them out for a model of ``inputs`` (the built-in
        model's spec; a configured model's layout is its feature map's)."""
        ...


@dataclass
class WorldWorkload:
    """The built-in model's synthetic world (its features already in Redis)."""

    world: SyntheticWorld

    def produce(self, settings: Settings, events: int) -> None:
        produce_events(settings, self.world, events)

    def batches(self, inputs: FeatureSpec | InputLayout, rows: int, count: int) -> list[ModelBatch]:
        if not isinstance(inputs, FeatureSpec):
            raise ValueError("the synthetic world lays out the built-in model's input")
        out = []
        for i in range(count):
            cols = batch_of_rows(self.world, inputs, rows, seed=i)
            out.append(ModelBatch(build_model_input(cols, inputs), cols.num_events))
        return out


@dataclass
class ConfiguredWorkload:
    """A configured model's events and records (the records already in Redis)."""

    settings: Settings
    fmap: FeatureMap
    _seed: int = 0

    def produce(self, settings: Settings, events: int) -> None:
        produce_records(settings, events, seed=1_000_000 * self._next_seed())

    def batches(self, inputs: FeatureSpec | InputLayout, rows: int, count: int) -> list[ModelBatch]:
        """Synthetic events through the configured decode (raw framing), the configured
        enricher (the seeded Redis records) and the mapped features."""
        codec = self.settings.codec.model_copy(update={"framing": Framing.RAW})
        plain = self.settings.model_copy(update={"codec": codec})
        decoder = ConfiguredDecoder(codec, self.fmap)
        enricher = ConfiguredEnricher(self.settings.redis, self.fmap, Metrics())
        features = MappedFeatures(self.fmap)
        out = []
        for i in range(count):
            source = event_records(plain, max(8, rows // 2), self._next_seed() + 1000 * i)
            events, _, _ = decoder.decode_values([source.encode(r) for r in source.records])
            keep = int(np.searchsorted(np.cumsum(events.candidate_counts), rows, side="right"))
            events = events.slice(0, max(1, keep))
            enrichment = enricher.enrich(events.user_ids, events.candidate_ids)
            out.append(ModelBatch(features.build(events, enrichment), events.num_events))
        return out

    def _next_seed(self) -> int:
        self._seed += 1
        return self._seed


def workload(settings: Settings, seed_redis: bool = True) -> Workload:
    """The workload of the model ``settings`` serve, its features written to Redis first (the
    built-in world's records; a configured model's layouts, or the world's on the built-in
    UserEvent schema).

    Args:
        settings: the model, its input and the stack.
        seed_redis: write the built-in world's records (``False``: only its batches are
            needed, e.g. ``bench model``, which needs no stack); a configured model's records
            are always written (its batches are read from them).

    Example::

        workload(settings).produce(run_settings, 20_000)
    """
    if settings.model.module is None:
        return WorldWorkload(seeded_world(settings) if seed_redis else build_world(settings))
    _, fmap = configured_module(settings)
    if settings.events.configured:
        seed_layouts(settings, fmap)
    else:
        seeded_world(settings)
    return ConfiguredWorkload(settings, fmap)
