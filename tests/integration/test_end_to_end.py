"""The whole job against the real Kafka broker and Redis of the session stack."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from model.features.spec import FeatureSpec
from model.synthetic import SyntheticWorld
from pipeline.settings.codec import CodecSettings
from pipeline.settings.loading import Settings
from pipeline.settings.redis import RedisSettings
from pipeline.settings.retrieval import RetrievalSettings
from pipeline.stages.dead_letter import DETAIL_HEADER, REASON_HEADER
from tests.faults.helpers import dead_letters, seeded_settings
from tests.integration.conftest import (
    BackgroundPipeline,
    SentEvents,
    collect,
    max_score_error,
    offline_scores,
    seed_features,
)
from tests.support.malformed import malformed_values

pytestmark = pytest.mark.slow


def assert_well_formed(recs: list[dict], sent: SentEvents) -> None:
    by_id = {r["event_id"]: r for r in sent.records}
    for rec in recs:
        event = by_id[rec["event_id"]]
        assert rec["user_id"] == event["user_id"]
        expected = min(event["num_results"], len(event["candidate_item_ids"]))
        assert len(rec["items"]) == expected
        scores = [i["score"] for i in rec["items"]]
        assert scores == sorted(scores, reverse=True)
        assert all(0.0 <= s <= 1.0 for s in scores)
        items = [i["item_id"] for i in rec["items"]]
        assert len(set(items)) == len(items)
        assert set(items) <= set(event["candidate_item_ids"])


@pytest.mark.parametrize("overlap", [False, True], ids=["sync-forward", "overlapped-forward"])
def test_every_valid_event_gets_exactly_one_recommendation(
    overlap: bool,
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[[Settings], BackgroundPipeline],
) -> None:
    settings = pipeline_settings.model_copy(
        update={
            "batching": pipeline_settings.batching.model_copy(update={"overlap_forward": overlap})
        }
    )
    sent = send_events(settings, 400)
    bp = background_pipeline(settings)
    recs = collect(settings, expected=400)
    summary = bp.stop()

    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == sent.ids
    assert max(counts.values()) == 1, "an event was scored twice"
    assert_well_formed(recs, sent)
    assert all(r["fallback_features"] == [] for r in recs)
    assert summary.events_out == 400 and summary.dead_lettered == 0
    # Batching really happened: fewer batches than events, none over the row limit.
    assert summary.batches < 400


def test_malformed_messages_go_to_the_dlq_and_valid_ones_are_still_scored(
    settings_factory: Callable[..., Settings],
    trained_checkpoint: Path,
    world: SyntheticWorld,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[[Settings], BackgroundPipeline],
    consumer_factory: Callable[..., Consumer],
) -> None:
    settings = seeded_settings(
        settings_factory,
        trained_checkpoint,
        world,
        codec=CodecSettings(max_message_bytes=4096, max_candidates=200),
        retrieval=RetrievalSettings(enabled=False),  # an empty candidate list is rejected
    )
    expected_reasons = malformed_values(settings, world)
    values = list(expected_reasons)
    sent = send_events(settings, 200, extra_values=list(values))
    dlq = consumer_factory(settings.topics.dlq)
    bp = background_pipeline(settings)
    recs = collect(settings, expected=200)
    dead = dead_letters(dlq, expected=len(values))
    summary = bp.stop()

    assert {r["event_id"] for r in recs} == sent.ids and len(recs) == 200
    assert_well_formed(recs, sent)
    assert len(dead) == len(values)
    where = {  # each malformed value's place on the input topic
        m.value() or b"": (m.partition(), m.offset())
        for m in dead_letters(consumer_factory(settings.topics.input), 200 + len(values))
        if (m.value() or b"") in expected_reasons
    }
    dead_values = set()
    for msg in dead:
        headers = dict(msg.headers())
        value = msg.value() or b""
        dead_values.add(value)  # the original bytes, untouched
        assert headers[REASON_HEADER].decode() in expected_reasons[value]
        assert headers[DETAIL_HEADER]
        assert headers["x-source-topic"].decode() == settings.topics.input
        source = (int(headers["x-source-partition"]), int(headers["x-source-offset"]))
        assert source == where[value]
        assert int(headers["x-dlq-time"]) > 0
    assert dead_values == set(values)
    assert summary.dead_lettered == len(values)


def test_scores_equal_offline_model_scores(
    pipeline_settings: Settings,
    spec: FeatureSpec,
    world: SyntheticWorld,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[[Settings], BackgroundPipeline],
) -> None:
    sent = send_events(pipeline_settings, 150)
    bp = background_pipeline(pipeline_settings)
    recs = collect(pipeline_settings, expected=150)
    bp.stop()

    assert len(recs) == 150
    offline = offline_scores(sent, world, spec, pipeline_settings.model.checkpoint)
    assert max_score_error(recs, offline) <= 1e-5


def test_redis_outage_serves_defaults_with_fallback_flag_and_loses_nothing(
    settings_factory: Callable[..., Settings],
    trained_checkpoint: Path,
    world: SyntheticWorld,
    redis_server_factory: Callable,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[[Settings], BackgroundPipeline],
) -> None:
    from tests.integration.conftest import WORLD, model_settings

    server = redis_server_factory()
    settings = settings_factory(
        model=model_settings(trained_checkpoint),
        synthetic=WORLD,
        redis=RedisSettings(
            url=server.url,
            key_prefix="sr",
            cache_ttl_s=0.0,
            socket_timeout_ms=100,
            connect_timeout_ms=100,
            retry_after_s=0.5,
        ),
    )
    seed_features(settings, world)
    bp = background_pipeline(settings)
    before = send_events(settings, 100)
    recs_before = collect(settings, expected=100)
    assert {r["event_id"] for r in recs_before} == before.ids
    assert all(r["fallback_features"] == [] for r in recs_before)

    server.stop()  # Redis goes away mid-run
    after = send_events(settings, 100)
    recs = collect(settings, expected=200)
    summary = bp.stop()

    by_id = {r["event_id"]: r for r in recs}
    assert set(by_id) == before.ids | after.ids
    assert len(recs) == 200
    for event_id in after.ids:
        assert set(by_id[event_id]["fallback_features"]) == {"user_features", "item_features"}
    assert_well_formed([by_id[i] for i in after.ids], after)
    assert summary.events_out == 200


def test_a_second_group_member_takes_over_partitions_without_loss_or_repeats(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[[Settings], BackgroundPipeline],
) -> None:
    first = background_pipeline(pipeline_settings)
    early = send_events(pipeline_settings, 300)
    assert len(collect(pipeline_settings, expected=300)) >= 300
    second = background_pipeline(pipeline_settings)  # same group: partitions are rebalanced
    deadline = time.monotonic() + 60
    while not second.pipeline.assignment and time.monotonic() < deadline:
        time.sleep(0.2)
    assert second.pipeline.assignment, "the second member never got partitions"
    late = send_events(pipeline_settings, 600)
    recs = collect(pipeline_settings, expected=900)
    s1, s2 = first.stop(), second.stop()

    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == early.ids | late.ids
    assert max(counts.values()) == 1  # revocation scores and commits before the handover
    assert s2.events_out > 0, "the second member never got partitions"
    assert s1.events_out + s2.events_out == 900
