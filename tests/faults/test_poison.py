"""Fault (g): a processing failure for one event, injected through the enricher or the scorer
the pipeline takes as arguments (:mod:`tests.support.faults`), on the real broker and Redis:
that event lands in the DLQ with ``processing_error``, the rest of its batch is scored, every
offset is committed and nothing is scored twice."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer

from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec
from pipeline.observability.metrics import Metrics
from pipeline.settings.loading import Settings
from pipeline.stages.dead_letter import DETAIL_HEADER, REASON_HEADER
from pipeline.stages.enrich.enricher import FeatureEnricher
from tests.faults.helpers import dead_letters
from tests.integration.conftest import (
    BackgroundPipeline,
    SentEvents,
    checkpoint_scorer,
    collect,
    spec_of,
)
from tests.support.faults import FailingEnricher, FailingScorer

POISON_RESULTS = 999  # num_results of the poison event (the scorer wrapper fails on it)

pytestmark = pytest.mark.slow


POISON_USER = 2**62 + 7  # a user of no other event (the synthetic ids start at 10**12)


@pytest.mark.parametrize("stage", ["enrich", "scoring"])
def test_an_event_failing_after_decode_is_dead_lettered_and_its_batch_scored(
    stage: str,
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[..., BackgroundPipeline],
    consumer_factory: Callable[..., Consumer],
) -> None:
    settings = pipeline_settings
    codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    first = send_events(settings, 1)
    poison = {
        **first.records[0],
        "event_id": f"poison-{stage}",
        "event_time": int(time.time() * 1000),
        **({"user_id": POISON_USER} if stage == "enrich" else {"num_results": POISON_RESULTS}),
    }
    sent = send_events(settings, 300, extra_values=[codec.encode(poison)])
    valid = first.ids | sent.ids
    dlq = consumer_factory(settings.topics.dlq)
    scorer = checkpoint_scorer(settings)
    spec = spec_of(settings)
    enricher = FeatureEnricher(
        settings.redis, spec.user_dense_dim, spec.item_dense_dim, spec.recent_items_cap, Metrics()
    )
    bp = background_pipeline(
        settings,
        scorer=FailingScorer(scorer, {POISON_RESULTS}),
        enricher=FailingEnricher(enricher, {POISON_USER}),
    )
    recs = collect(settings, expected=len(valid))
    dead = dead_letters(dlq, expected=1)
    summary = bp.stop()

    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == valid  # the poison event alone is missing
    assert max(counts.values()) == 1
    assert len(dead) == 1
    headers = dict(dead[0].headers())
    assert headers[REASON_HEADER] == b"processing_error"
    assert f"InjectedFault: injected {stage} failure" in headers[DETAIL_HEADER].decode()
    assert codec.decode(dead[0].value())["event_id"] == poison["event_id"]
    assert summary.events_out == 301 and summary.dead_lettered == 1
    assert summary.batches < 300  # the batch was bisected, not scored event by event
    run = bp.pipeline._run
    assert run is not None  # every offset committed, as confirmed by the broker (on_commit)
    checkpointer = run.checkpointer
    assert sum(checkpointer.committed.values()) == 302
    assert checkpointer.commit_failures == 0
