"""A model version promoted while the loop runs (fake Kafka clients, real tiny checkpoints):
swapped in between two batches, each partition switching once and in order, retrieved
candidates always from the index of the version that scores them; a corrupt version leaves the
old one serving and is counted."""

from __future__ import annotations

import logging
from collections import Counter, deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model.rank import RankContext
from model.ranker import build_ranker
from model.retrieval.candidates import fill_candidates
from model.store.versions import ModelVersions
from pipeline.connectors.avro.reference import (
    RECOMMENDATION_SCHEMA_FILE,
    RecordCodec,
    records_to_columns,
)
from pipeline.connectors.kafka.clients import KafkaClients
from pipeline.models.loader import ModelLoader
from pipeline.observability.metrics import Metrics
from pipeline.runtime.loop import ScoringPipeline
from pipeline.serve import build_pipeline
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.loading import Settings
from pipeline.settings.metrics import MetricsSettings
from pipeline.settings.model import ModelSettings
from pipeline.settings.retrieval import CatalogueSource, ModelSwapSettings, RetrievalSettings
from pipeline.settings.topics import TopicsSettings
from tests.pipeline.factories import TINY_SPEC, DefaultsEnricher, encode_events, user_event
from tests.pipeline.fakes import FakeConsumer, FakeMessage, FakeProducer

IN, OUT, DLQ = "in", "out", "dlq"
PARTITIONS = 3
CATALOGUE = np.arange(2_000, 2_080, dtype=np.int64)


@pytest.fixture
def versions(tmp_path: Path) -> ModelVersions:
    versions = ModelVersions.create(tmp_path / "models")
    versions.write(build_ranker(TINY_SPEC, seed=0), TINY_SPEC, version="tiny-a", promote=True)
    versions.write(build_ranker(TINY_SPEC, seed=1), TINY_SPEC, version="tiny-b")
    versions.write(build_ranker(TINY_SPEC, seed=2), TINY_SPEC, version="tiny-broken")
    weights = versions.path("tiny-broken") / "model.pt"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated after it was placed
    return versions


def _settings(versions: ModelVersions, tmp_path: Path) -> Settings:
    catalogue = tmp_path / "items.npy"
    np.save(catalogue, CATALOGUE)
    return Settings(
        topics=TopicsSettings(input=IN, output=OUT, dlq=DLQ),
        batching=BatchingSettings(max_batch_rows=24, max_delay_ms=5, consume_batch_size=15),
        metrics=MetricsSettings(enabled=False),
        model=ModelSettings(checkpoint=versions.root, device="cpu"),
        retrieval=RetrievalSettings(
            num_candidates=5, catalogue=CatalogueSource.FILE, catalogue_path=catalogue
        ),
        model_swap=ModelSwapSettings(poll_interval_s=3600),  # the test checks the pointer
    )


def _records(n: int) -> list[dict[str, Any]]:
    """Every third event brings no candidates (it is answered from the index)."""
    return [
        user_event(candidates=0 if i % 3 == 1 else 2 + i % 4, user_id=100 + i, num_results=3)
        for i in range(n)
    ]


def _run_with_promotion(
    versions: ModelVersions, settings: Settings, promote: str, records: list[dict[str, Any]]
) -> tuple[ScoringPipeline, FakeProducer, FakeConsumer]:
    values = encode_events(records)
    messages = [FakeMessage(IN, v, i % PARTITIONS, i // PARTITIONS) for i, v in enumerate(values)]
    consumer = FakeConsumer(
        messages=deque(messages), partitions=[(IN, p) for p in range(PARTITIONS)]
    )
    producer = FakeProducer(ack_every_poll=True)
    pipeline = build_pipeline(
        settings,
        RankContext(),
        Metrics(),
        checkpoint=versions.current_path(),
        enricher=DefaultsEnricher(TINY_SPEC),
        clients=lambda kafka, topics, stats_cb: KafkaClients.of(consumer, producer),
    )
    models = pipeline.models
    assert models is not None
    original_consume = consumer.consume
    promoted = False

    def consume_then_promote(num_messages: int = 1, timeout: float = -1) -> list[Any]:
        nonlocal promoted
        got = original_consume(num_messages, timeout)
        if not promoted and pipeline.summary.events_out >= len(records) // 3:
            promoted = True
            versions.promote(promote)
            models.watcher.check_once()  # what the watcher's thread does (here: now)
        return got

    consumer.consume = consume_then_promote  # type: ignore[method-assign]
    pipeline.run(exit_when_idle_s=0.2)
    assert promoted
    return pipeline, producer, consumer


def _outputs(producer: FakeProducer) -> list[dict[str, Any]]:
    """Every Recommendation produced, in production order."""
    codec = RecordCodec(Settings().codec, RECOMMENDATION_SCHEMA_FILE, OUT)
    return [codec.decode(r.value() or b"") for r in producer.on_topic(OUT)]


def test_a_promoted_version_is_swapped_in_between_batches(
    versions: ModelVersions, tmp_path: Path
) -> None:
    settings = _settings(versions, tmp_path)
    records = _records(90)
    by_id = {r["event_id"]: (i, r) for i, r in enumerate(records)}
    pipeline, producer, consumer = _run_with_promotion(versions, settings, "tiny-b", records)

    recs = _outputs(producer)
    assert Counter(r["event_id"] for r in recs) == Counter(r["event_id"] for r in records)
    assert not producer.on_topic(DLQ)
    # Each partition's outputs switch version once, in order: old ones first, then new ones.
    for partition in range(PARTITIONS):
        seen = [
            r["model_version"] for r in recs if by_id[r["event_id"]][0] % PARTITIONS == partition
        ]
        switch = seen.index("tiny-b")
        assert seen == ["tiny-a"] * switch + ["tiny-b"] * (len(seen) - switch), partition
        assert 0 < switch < len(seen)
    # Retrieved candidates come from the index of the version that scored the event.
    loader = ModelLoader(settings)
    indexes = {v: loader.load(versions.path(v)).index for v in ("tiny-a", "tiny-b")}
    retrieved = [r for r in recs if r["retrieved"]]
    assert {r["model_version"] for r in retrieved} == {"tiny-a", "tiny-b"}
    assert len(retrieved) == sum(1 for r in records if not r["candidate_item_ids"])
    for rec in retrieved:
        index = indexes[rec["model_version"]]
        assert index is not None
        event = records_to_columns([by_id[rec["event_id"]][1]])
        want = fill_candidates(event, index, 5).candidate_ids.tolist()
        assert len(want) == 5 and len(rec["items"]) == 3
        assert {i["item_id"] for i in rec["items"]} <= set(want)
    for rec in recs:
        if not rec["retrieved"]:
            assert {i["item_id"] for i in rec["items"]} <= set(
                by_id[rec["event_id"]][1]["candidate_item_ids"]
            )
    metrics = pipeline.metrics.registry
    assert metrics.get_sample_value("streamrank_model_swaps_total") == 1
    assert metrics.get_sample_value("streamrank_model_info", {"model_version": "tiny-b"}) == 1
    assert metrics.get_sample_value("streamrank_model_load_failures_total") == 0
    assert consumer.committed == {
        (IN, p): len(range(p, len(records), PARTITIONS)) for p in range(PARTITIONS)
    }


def test_a_corrupt_version_leaves_the_old_one_serving(
    versions: ModelVersions, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = _settings(versions, tmp_path)
    records = _records(45)
    with caplog.at_level(logging.WARNING):
        pipeline, producer, _ = _run_with_promotion(versions, settings, "tiny-broken", records)
    recs = _outputs(producer)
    assert sorted(r["event_id"] for r in recs) == sorted(r["event_id"] for r in records)
    assert {r["model_version"] for r in recs} == {"tiny-a"}
    metrics = pipeline.metrics.registry
    assert metrics.get_sample_value("streamrank_model_load_failures_total") == 1
    assert metrics.get_sample_value("streamrank_model_swaps_total") == 0
    failures = [r.getMessage() for r in caplog.records if "failed to load" in r.getMessage()]
    assert len(failures) == 1 and "still serving tiny-a" in failures[0]
