"""The whole scoring loop on fake Kafka clients, for the loop, isolation and rewind tests: its
settings (topics :data:`IN`, :data:`OUT`, :data:`DLQ`, no metrics server), the loop itself, and
the event ids it published."""

from __future__ import annotations

from typing import Any

from pipeline.connectors.avro.reference import RECOMMENDATION_SCHEMA_FILE, RecordCodec
from pipeline.connectors.kafka.clients import KafkaClients
from pipeline.runtime.loop import ScoringPipeline
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.delivery import DeliverySettings
from pipeline.settings.loading import Settings
from pipeline.settings.metrics import MetricsSettings
from pipeline.settings.topics import TopicsSettings
from tests.pipeline.factories import DefaultsEnricher, tiny_scorer
from tests.pipeline.fakes import FakeConsumer, FakeProducer

IN, OUT, DLQ = "in", "out", "dlq"


def loop_settings(batching: BatchingSettings, delivery: DeliverySettings | None = None) -> Settings:
    """Settings of a loop reading :data:`IN`, writing :data:`OUT` and :data:`DLQ`."""
    return Settings(
        topics=TopicsSettings(input=IN, output=OUT, dlq=DLQ),
        batching=batching,
        delivery=delivery or DeliverySettings(),
        metrics=MetricsSettings(enabled=False),
    )


def fake_loop(
    settings: Settings, consumer: FakeConsumer, producer: FakeProducer, **parts: Any
) -> ScoringPipeline:
    """The loop on ``consumer`` and ``producer``; ``parts``: more of its keyword arguments
    (``scorer``: the tiny scorer, ``enricher``: default features, unless given)."""
    scorer = parts.pop("scorer", None) or tiny_scorer()
    enricher = parts.pop("enricher", None) or DefaultsEnricher()
    return ScoringPipeline(
        settings,
        scorer,
        enricher=enricher,
        clients=lambda kafka, topics, stats_cb: KafkaClients.of(consumer, producer),
        **parts,
    )


def published_event_ids(settings: Settings, producer: FakeProducer) -> list[str]:
    """The event id of every Recommendation on :data:`OUT`, in order."""
    codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, OUT)
    return [codec.decode(r.value() or b"")["event_id"] for r in producer.on_topic(OUT)]
