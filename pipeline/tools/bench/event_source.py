"""The events of a benchmark one by one, and how to read them back: the built-in model's
synthetic UserEvents, or a configured model's records synthesized from its schema
(``[model.module]`` with ``[events]``). Light on purpose: the paced producer process of ``bench
latency`` (:mod:`pipeline.tools.bench.offered_load`) imports it, and torch is imported only for a
configured model.

:class:`EventRecords` are the events with how to encode, stamp and identify each one (for a
producer that paces them and for the audits that look events up by id); :func:`produce_records`
sends them (``streamrank produce`` of a configured model); :class:`OutputFields` reads the event
id and scored-at time of an output record (the Recommendation's, or an ``[output]`` schema's).

Example::

    source = event_records(settings, 1000, seed=0)
    producer.produce(topic, source.encode(source.records[0]))
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from model.synthetic import to_event_dicts
from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec
from pipeline.connectors.avro.rules import epoch_millis
from pipeline.connectors.kafka.clients import ensure_topics, make_producer, produce
from pipeline.settings.loading import Settings
from pipeline.tools.recommendation_reader import recommendation_codec
from pipeline.tools.synthetic_io import build_world

__all__ = [
    "EventRecords",
    "OutputFields",
    "event_id_reader",
    "event_records",
    "produce_records",
]


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
    from pipeline.models.preflight import configured_module  # torch: only for [model.module]
    from pipeline.tools.bench.configured import synthetic_records

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
    from pipeline.models.preflight import configured_module  # torch: only for [model.module]

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
    ensure_topics(settings.kafka.config, settings.topics)
    producer = make_producer(settings.kafka.config)
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
