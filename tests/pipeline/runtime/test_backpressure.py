"""Backpressure: a full producer queue waits for room, pausing the input partitions only when
the wait is long; the in-flight limit waits without pausing."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from pipeline.runtime.backpressure import BackpressuredProducer
from pipeline.runtime.pausing import InputPause
from pipeline.stages.commit import Checkpointer
from pipeline.stages.source import KafkaSource
from pipeline.types import DeliveryFailed, Shutdown
from tests.pipeline.fakes import FakeConsumer, FakeProducer


class FullProducer(FakeProducer):
    """Raises BufferError for the first ``full_for`` produce calls."""

    def __init__(self, full_for: int) -> None:
        super().__init__()
        self.full_for = full_for

    def produce(self, *args: Any, **kwargs: Any) -> None:
        if self.full_for > 0:
            self.full_for -= 1
            raise BufferError("Local: Queue full")
        super().produce(*args, **kwargs)


def _source(consumer: FakeConsumer) -> KafkaSource:
    source = KafkaSource(consumer, "in", 10)
    source.assigned({("in", 0), ("in", 1)})
    return source


def test_a_short_wait_for_room_does_not_pause_the_input() -> None:
    consumer, producer = FakeConsumer(), FullProducer(full_for=3)
    source = _source(consumer)
    wrapped = BackpressuredProducer(producer, InputPause(source, 60.0), Shutdown(10.0))
    wrapped.produce("out", b"v", b"k")
    assert len(producer.records) == 1 and len(producer.polls) == 3 and wrapped.waits == 1
    assert consumer.paused == [] and source.pauses == 0 and not wrapped.paused


def test_a_long_wait_for_room_pauses_the_input_until_the_record_fits() -> None:
    consumer, producer = FakeConsumer(), FullProducer(full_for=3)
    source = _source(consumer)
    wrapped = BackpressuredProducer(producer, InputPause(source, 0.0), Shutdown(10.0))
    wrapped.produce("out", b"v", b"k")
    assert len(producer.records) == 1
    assert consumer.paused == [[("in", 0), ("in", 1)]] == consumer.resumed
    assert len(producer.polls) == 3 and wrapped.waits == 1 and source.pauses == 1
    assert not wrapped.paused
    wrapped.produce("out", b"v2")  # room again: no pause
    assert source.pauses == 1


def test_a_queue_full_past_the_shutdown_deadline_gives_up_and_resumes() -> None:
    consumer, producer = FakeConsumer(), FullProducer(full_for=10**9)
    source = _source(consumer)
    started = time.monotonic()
    shutdown = Shutdown(0.2)
    shutdown.request()
    wrapped = BackpressuredProducer(producer, InputPause(source, 0.0), shutdown)
    with pytest.raises(DeliveryFailed, match="queue still full"):
        wrapped.produce("out", b"v")
    assert time.monotonic() - started < 2.0
    assert consumer.resumed == consumer.paused


def test_the_in_flight_limit_waits_for_acks_without_pausing_the_input() -> None:
    consumer, producer = FakeConsumer(), FakeProducer(acks_per_poll=1)
    source = _source(consumer)
    ckpt = Checkpointer(consumer, producer, max_sealed=1)  # type: ignore[arg-type]
    for offset in range(3):
        ckpt.consumed("in", np.array([0]), np.array([offset]))
        checkpoint = ckpt.cut()
        producer.produce("out", b"", on_delivery=checkpoint.expect_delivery())
        checkpoint.seal()
    ckpt.commit_ready()
    assert source.pauses == 0 and consumer.paused == []
    assert ckpt.in_flight <= 1 and len(producer.polls) >= 2
