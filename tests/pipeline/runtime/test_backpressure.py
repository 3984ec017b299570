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
from pipeline.types import Checkpoint, DeliveryFailed, Shutdown
from tests.pipeline.fakes import FakeConsumer, FakeProducer, edge_consumer, edge_producer


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
    source = KafkaSource(edge_consumer(consumer), "in", 10)
    source.assigned({("in", 0), ("in", 1)})
    return source


def test_a_short_wait_for_room_does_not_pause_the_input() -> None:
    consumer, producer = FakeConsumer(), FullProducer(full_for=3)
    source = _source(consumer)
    wrapped = BackpressuredProducer(
        edge_producer(producer), InputPause(source, 60.0), Shutdown(10.0)
    )
    wrapped.produce("out", b"v", b"k", None, Checkpoint())
    assert len(producer.records) == 1 and len(producer.polls) == 3 and wrapped.waits == 1
    assert consumer.paused == [] and source.pauses == 0 and not wrapped.paused


def test_a_batch_that_meets_a_full_queue_goes_on_where_it_stopped() -> None:
    consumer, producer = FakeConsumer(), FullProducer(full_for=0)
    source = _source(consumer)
    wrapped = BackpressuredProducer(
        edge_producer(producer), InputPause(source, 60.0), Shutdown(10.0)
    )
    checkpoint = Checkpoint()
    values, keys = [b"a", b"b", b"c", b"d"], [b"1", b"2", b"3", b"4"]
    checkpoint.expect(len(values))
    sent = FullAfter(producer, records=2, full_for=2)
    producer.produce = sent  # type: ignore[method-assign]
    wrapped.produce_batch("out", values, keys, checkpoint)
    assert [r.value() for r in producer.records] == values  # each once, in order
    assert [r.key() for r in producer.records] == keys
    assert wrapped.waits == 1 and len(producer.polls) == 2
    producer.ack()
    assert checkpoint.pending == 0 and checkpoint.error is None


class FullAfter:
    """A ``produce`` that takes ``records``, then finds the queue full ``full_for`` times."""

    def __init__(self, producer: FakeProducer, records: int, full_for: int) -> None:
        self.real = producer.produce
        self.records = records
        self.full_for = full_for

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if self.records == 0 and self.full_for > 0:
            self.full_for -= 1
            raise BufferError("Local: Queue full")
        self.records -= 1
        self.real(*args, **kwargs)


def test_a_long_wait_for_room_pauses_the_input_until_the_record_fits() -> None:
    consumer, producer = FakeConsumer(), FullProducer(full_for=3)
    source = _source(consumer)
    wrapped = BackpressuredProducer(
        edge_producer(producer), InputPause(source, 0.0), Shutdown(10.0)
    )
    wrapped.produce("out", b"v", b"k", None, Checkpoint())
    assert len(producer.records) == 1
    assert consumer.paused == [[("in", 0), ("in", 1)]] == consumer.resumed
    assert len(producer.polls) == 3 and wrapped.waits == 1 and source.pauses == 1
    assert not wrapped.paused
    wrapped.produce("out", b"v2", None, None, Checkpoint())  # room again: no pause
    assert source.pauses == 1


def test_a_queue_full_past_the_shutdown_deadline_gives_up_and_resumes() -> None:
    consumer, producer = FakeConsumer(), FullProducer(full_for=10**9)
    source = _source(consumer)
    started = time.monotonic()
    shutdown = Shutdown(0.2)
    shutdown.request()
    wrapped = BackpressuredProducer(edge_producer(producer), InputPause(source, 0.0), shutdown)
    with pytest.raises(DeliveryFailed, match="queue still full"):
        wrapped.produce_batch("out", [b"v"], [b"k"], Checkpoint())
    assert time.monotonic() - started < 2.0
    assert consumer.resumed == consumer.paused


def test_the_in_flight_limit_waits_for_acks_without_pausing_the_input() -> None:
    consumer, producer = FakeConsumer(), FakeProducer(acks_per_poll=1)
    source = _source(consumer)
    output = edge_producer(producer)
    ckpt = Checkpointer(edge_consumer(consumer), output, max_sealed=1)
    for offset in range(3):
        ckpt.consumed("in", np.array([0]), np.array([offset]))
        checkpoint = ckpt.cut()
        checkpoint.expect()
        output.send("out", [b""], [None], checkpoint)
        checkpoint.seal()
    ckpt.commit_ready()
    assert source.pauses == 0 and consumer.paused == []
    assert ckpt.in_flight <= 1 and len(producer.polls) >= 2
