"""Backpressure on the real stack: with a producer queue of 20 records that librdkafka holds for
1.5 s before sending (``linger.ms``), a record waits longer than
:data:`~pipeline.runtime.pausing.PAUSE_AFTER_S` for room, the pipeline pauses its input
partitions
instead of spinning, and still scores every event exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from pipeline.settings.loading import Settings
from tests.integration.conftest import BackgroundPipeline, SentEvents, collect

pytestmark = pytest.mark.slow


def test_a_full_producer_queue_pauses_the_input_and_loses_nothing(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[..., BackgroundPipeline],
) -> None:
    kafka = pipeline_settings.kafka.model_copy(
        update={"producer_extra": {"queue.buffering.max.messages": 20, "linger.ms": 1500}}
    )
    settings = pipeline_settings.model_copy(update={"kafka": kafka})
    sent = send_events(settings, 100)
    bp = background_pipeline(settings)
    recs = collect(settings, expected=100)
    summary = bp.stop()

    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == sent.ids and max(counts.values()) == 1
    assert summary.events_out == 100
    run = bp.pipeline._run
    assert run is not None and run.source.pauses > 0  # the queue really was full
