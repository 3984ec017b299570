"""What a benchmark feeds the pipeline: the built-in model's synthetic world, or a configured
model's own input (``[model.module]``: events synthesized from its schema, Redis records from its
layouts, :mod:`pipeline.tools.bench.configured`).

A :class:`Workload` seeds the features once (:func:`workload`), produces events to a topic, and
builds batches of model input the way the serving path builds them (the built-in layout kernel;
for a configured model the configured decode, the configured enricher reading the seeded Redis
records, and the mapped features), for the forward-only timings. :class:`EventRecords` are the
same events one by one, for a producer that paces them (``bench latency``'s offered load) and
for the audits that look events up by id (``bench latency``, ``bench soak``).

Example::

    load = workload(settings)                       # seeds Redis
    load.produce(run_settings, 5000)                # a backlog on run_settings.topics.input
    batches = load.batches(scorer.spec if scorer.builtin else scorer.layout, 4096, 16)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from model.features.build import build_model_input
from model.features.layout import InputLayout
from model.features.mapping import FeatureMap
from model.features.model_input import ModelInput
from model.features.spec import FeatureSpec
from model.synthetic import SyntheticWorld, to_event_dicts
from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec
from pipeline.connectors.avro.rules import epoch_millis
from pipeline.connectors.kafka.clients import ensure_topics, make_producer, produce
from pipeline.models.preflight import configured_module
from pipeline.observability.metrics import Metrics
from pipeline.settings.codec import Framing
from pipeline.settings.loading import Settings
from pipeline.stages.decode import ConfiguredDecoder
from pipeline.stages.enrich.configured import ConfiguredEnricher
from pipeline.stages.features import MappedFeatures
from pipeline.tools.bench.common import batch_of_rows, seeded_world
from pipeline.tools.bench.configured import seed_layouts, synthetic_records
from pipeline.tools.recommendation_reader import recommendation_codec
from pipeline.tools.synthetic_io import build_world, produce_events

__all__ = [
    "EventRecords",
    "ModelBatch",
    "OutputFields",
    "Workload",
    "event_id_reader",
    "event_records",
    "produce_records",
    "workload",
]


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


@dataclass
class EventRecords:
    """Events of a workload as records, and how to encode and read each one.

    Attributes:
        records: the events (``event_time`` as sampled: :meth:`stamp` sets it when sent).
        encode: a record -> the message value (the configured framing).
        event_id: a record -> its event id (as the output echoes it).
        candidates: a record -> its candidate count (its rows).
        key: a record -> the message key (its user id).
        stamp: sets a record's event time (epoch milliseconds).
    """

    records: list[dict[str, Any]]
    encode: Callable[[dict[str, Any]], bytes]
    event_id: Callable[[dict[str, Any]], str]
    candidates: Callable[[dict[str, Any]], int]
    key: Callable[[dict[str, Any]], bytes]
    stamp: Callable[[dict[str, Any], int], None] = field(repr=False)


def event_records(settings: Settings, total: int, seed: int) -> EventRecords:
    """``total`` events of the model ``settings`` serve: the synthetic world's UserEvents, or a
    configured schema's synthesized records (their roles read through the feature map).

    Example::

        source = event_records(settings, 1000, seed=0)
        producer.produce(topic, source.encode(source.records[0]))
    """
    now_ms = int(time.time() * 1000)
    if settings.model.module is None or not settings.events.configured:
        world = build_world(settings)
        sampled = world.sample_events(total, np.random.default_rng(seed))
        records = list(to_event_dicts(sampled, world))
        codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)

        def stamp_builtin(record: dict[str, Any], ms: int) -> None:
            record["event_time"] = ms

        return EventRecords(
            records,
            codec.encode,
            lambda r: str(r["event_id"]),
            lambda r: len(r["candidate_item_ids"]),
            lambda r: str(r["user_id"]).encode(),
            stamp_builtin,
        )
    _, fmap = configured_module(settings)
    roles = fmap.roles
    codec = RecordCodec(settings.codec, Path(fmap.schema_name), settings.topics.input)
    time_path = roles.event_time.path

    def stamp(record: dict[str, Any], ms: int) -> None:
        node = record
        for part in time_path[:-1]:
            node = node[part]
        node[time_path[-1]] = ms

    records = synthetic_records(fmap, total, seed)
    for record in records:
        stamp(record, now_ms)
    return EventRecords(
        records,
        codec.encode,
        lambda r: str(roles.event_id.read(r)),
        lambda r: len(roles.candidates.read(r)),
        lambda r: str(roles.user_id.read(r)).encode(),
        stamp,
    )


def event_id_reader(settings: Settings) -> Callable[[bytes], str]:
    """An input message's value -> its event id (the UserEvent's, or ``events.event_id``).

    Example::

        event_id_reader(settings)(message.value())
    """
    if settings.model.module is None or not settings.events.configured:
        codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
        return lambda value: str(codec.decode(value)["event_id"])
    _, fmap = configured_module(settings)
    mine = RecordCodec(settings.codec, Path(fmap.schema_name), settings.topics.input)
    return lambda value: str(fmap.roles.event_id.read(mine.decode(value)))


def produce_records(
    settings: Settings,
    events: int,
    *,
    rate: float | None = None,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Produce ``events`` of :func:`event_records` to ``settings.topics.input`` (created if
    needed), each one's event time stamped as it is sent, at ``rate`` events/s (``None``: as
    fast as possible); sampled a thousand at a time.

    Returns:
        The events sent (all acknowledged).

    Raises:
        RuntimeError: some were not delivered.

    Example::

        produce_records(settings, 60_000, rate=200.0)   # `streamrank produce` of [model.module]
    """
    ensure_topics(settings.kafka, settings.topics)
    producer = make_producer(settings.kafka)
    topic = settings.topics.input
    started, sent = time.monotonic(), 0
    for first in range(0, events, 1000):
        source = event_records(settings, min(1000, events - first), seed + first)
        for record in source.records:
            if rate:
                time.sleep(max(0.0, started + sent / rate - time.monotonic()))
            source.stamp(record, int(time.time() * 1000))
            produce(producer, topic, source.encode(record), key=source.key(record))
            sent += 1
        producer.poll(0)
        if progress is not None:
            progress(len(source.records))
    if producer.flush(60):
        raise RuntimeError(f"not every synthetic event was delivered to {topic}")
    return sent


@dataclass(frozen=True)
class OutputFields:
    """How a benchmark reads the output topic: the codec, and each record's event id and
    scored-at time (the Recommendation's fields, or the roles of an ``[output]`` schema).

    Attributes:
        codec: decodes the output records.
        event_id_path / scored_at_path: the fields, dotted (``scored_at_path`` ``""``: the
            schema has none, every record reads ``-1``).
    """

    codec: RecordCodec
    event_id_path: tuple[str, ...]
    scored_at_path: tuple[str, ...]

    @classmethod
    def of(cls, settings: Settings) -> OutputFields:
        """The output of ``settings`` (``[output]``'s roles, else the Recommendation's)."""
        output = settings.output
        if output.configured:
            return cls(
                recommendation_codec(settings),
                tuple(output.event_id.split(".")),
                tuple(output.scored_at.split(".")) if output.scored_at else (),
            )
        return cls(recommendation_codec(settings), ("event_id",), ("scored_at",))

    def event_id(self, record: dict[str, Any]) -> str:
        """A decoded output record's event id."""
        return str(_read(record, self.event_id_path))

    def scored_at_ms(self, record: dict[str, Any]) -> int:
        """A decoded output record's scored-at time, epoch milliseconds (``-1``: none)."""
        value = _read(record, self.scored_at_path) if self.scored_at_path else None
        return -1 if value is None else epoch_millis(value)


def _read(record: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = record
    for part in path:
        if value is None:
            return None
        value = value[part]
    return value
