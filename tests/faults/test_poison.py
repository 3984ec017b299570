"""Fault (g): a processing failure for one event id, injected by the test hook, on the real
broker and Redis: that event lands in the DLQ with ``processing_error``, the rest of its batch
is scored, every offset is committed and nothing is scored twice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer

from pipeline.config import Settings
from pipeline.faults import FAULTS_ENV_VAR
from pipeline.stages.publish import DETAIL_HEADER, REASON_HEADER
from tests.faults.helpers import dead_letters
from tests.integration.conftest import BackgroundPipeline, SentEvents, collect

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("stage", ["features", "forward"])
def test_an_event_failing_after_decode_is_dead_lettered_and_its_batch_scored(
    stage: str,
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[[Settings], BackgroundPipeline],
    consumer_factory: Callable[..., Consumer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent = send_events(pipeline_settings, 300)
    poison = sent.records[137]["event_id"]
    monkeypatch.setenv(FAULTS_ENV_VAR, f"{stage}:{poison}")
    dlq = consumer_factory(pipeline_settings.topics.dlq)
    bp = background_pipeline(pipeline_settings)
    recs = collect(pipeline_settings, expected=299)
    dead = dead_letters(dlq, expected=1)
    summary = bp.stop()

    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == sent.ids - {poison}
    assert max(counts.values()) == 1
    assert len(dead) == 1
    headers = dict(dead[0].headers())
    assert headers[REASON_HEADER] == b"processing_error"
    assert f"InjectedFault: injected {stage} failure for event {poison}" in (
        headers[DETAIL_HEADER].decode()
    )
    assert summary.events_out == 299 and summary.dead_lettered == 1
    assert summary.batches < 300  # the batch was bisected, not scored event by event
    stages = bp.pipeline._stages
    assert stages is not None  # every offset committed, as confirmed by the broker (on_commit)
    assert sum(stages.checkpointer.committed.values()) == 300
    assert stages.checkpointer.commit_failures == 0
