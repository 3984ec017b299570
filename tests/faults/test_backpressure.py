"""Backpressure on the real stack: with a producer queue of 20 records the pipeline pauses its
input partitions instead of spinning, and still scores every event exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from pipeline.config import Settings
from tests.integration.conftest import BackgroundPipeline, SentEvents, collect

pytestmark = pytest.mark.slow


def test_a_full_producer_queue_pauses_the_input_and_loses_nothing(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[..., BackgroundPipeline],
) -> None:
    kafka = pipeline_settings.kafka.model_copy(
        update={"producer_extra": {"queue.buffering.max.messages": 20, "linger.ms": 50}}
    )
    settings = pipeline_settings.model_copy(update={"kafka": kafka})
    sent = send_events(settings, 1500)
    bp = background_pipeline(settings)
    recs = collect(settings, expected=1500)
    summary = bp.stop()

    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == sent.ids and max(counts.values()) == 1
    assert summary.events_out == 1500
    run = bp.pipeline._run
    assert run is not None and run.source.pauses > 0  # the queue really was full
