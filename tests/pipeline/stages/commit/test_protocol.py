"""The commit protocol of Checkpointer, against small fakes of the consumer and producer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline.connectors.kafka.consumer import CommitResults
from pipeline.stages.commit import Checkpointer
from pipeline.types import DeliveryFailed, Shutdown
from tests.pipeline.fakes import (
    FakeConsumer,
    FakeMessage,
    FakeProducer,
    edge_consumer,
    edge_producer,
)

T = "events"


def _error() -> KafkaError:
    return KafkaError(KafkaError._MSG_TIMED_OUT)


@pytest.fixture
def consumer() -> FakeConsumer:
    return FakeConsumer()


@pytest.fixture
def producer() -> FakeProducer:
    return FakeProducer()


@pytest.fixture
def ckpt(consumer: FakeConsumer, producer: FakeProducer) -> Checkpointer:
    return Checkpointer(edge_consumer(consumer), edge_producer(producer))


def _produce(ckpt: Checkpointer, producer: FakeProducer, n: int = 1, error: bool = False) -> None:
    for _ in range(n):
        if error:
            producer.failures.append(_error())
        ckpt.open.expect()
        edge_producer(producer).send("recs", [b""], [None], ckpt.open)


def _consume(ckpt: Checkpointer, partition: int, offset: int) -> None:
    ckpt.consumed(T, np.array([partition]), np.array([offset]))


def _batch(
    ckpt: Checkpointer, producer: FakeProducer, offset: int, n: int = 1, error: bool = False
) -> None:
    """Partition 0's ``offset`` consumed, ``n`` records produced for it, the checkpoint sealed."""
    _consume(ckpt, 0, offset)
    _produce(ckpt, producer, n, error)
    ckpt.seal_open()


def test_commits_only_after_every_delivery_of_a_sealed_checkpoint(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    for offset in range(3):
        _consume(ckpt, 0, offset)
    _produce(ckpt, producer, 3)
    ckpt.seal_open()
    assert ckpt.in_flight == 3
    assert ckpt.commit_ready() == 0
    producer.ack(1)
    assert ckpt.commit_ready() == 0
    producer.ack(1)
    assert ckpt.commit_ready() == 0
    assert consumer.commits == []
    producer.ack(1)
    assert ckpt.in_flight == 0
    assert ckpt.commit_ready() == 1
    assert consumer.commits == [({(T, 0): 3}, True)]
    assert ckpt.committed == {(T, 0): 3}
    assert ckpt.commit_ready() == 0
    assert len(consumer.commits) == 1  # nothing new: no empty commit


def test_unsealed_checkpoint_is_never_committed(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _consume(ckpt, 0, 0)
    _produce(ckpt, producer)
    producer.ack()
    assert ckpt.commit_ready() == 0
    assert consumer.commits == []
    ckpt.seal_open()
    assert ckpt.commit_ready() == 1
    assert consumer.offsets == [{(T, 0): 1}]


def test_fifo_later_done_checkpoint_waits_for_earlier_pending(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _consume(ckpt, 0, 0)
    _consume(ckpt, 1, 10)
    _produce(ckpt, producer)
    ckpt.seal_open()
    _consume(ckpt, 0, 1)
    _consume(ckpt, 2, 20)
    _produce(ckpt, producer)
    ckpt.seal_open()

    producer.pending.pop()[0](None, FakeMessage("recs"))  # the LATER checkpoint is acked first
    assert ckpt.commit_ready() == 0
    assert consumer.commits == []

    producer.pending.pop()[0](None, FakeMessage("recs"))
    assert producer.pending == []
    assert ckpt.commit_ready() == 2
    assert consumer.offsets == [{(T, 0): 2, (T, 1): 11, (T, 2): 21}]  # one merged commit


def test_leading_done_checkpoints_commit_and_stop_at_first_pending(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    for offset in range(3):
        _batch(ckpt, producer, offset)
    producer.ack(2)
    assert ckpt.commit_ready() == 2
    assert consumer.offsets == [{(T, 0): 2}]
    producer.ack()
    assert ckpt.commit_ready() == 1
    assert consumer.offsets[-1] == {(T, 0): 3}


def test_next_offset_is_last_plus_one_per_partition(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _consume(ckpt, 0, 5)
    _consume(ckpt, 1, 9)
    _consume(ckpt, 0, 6)
    ckpt.consumed("other", np.array([0]), np.array([0]))
    _consume(ckpt, 3, 0)
    _produce(ckpt, producer)
    ckpt.seal_open()
    producer.ack()
    ckpt.commit_ready()
    assert consumer.offsets == [{(T, 0): 7, (T, 1): 10, ("other", 0): 1, (T, 3): 1}]


def test_delivery_error_raises_and_does_not_commit(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _consume(ckpt, 0, 0)
    _produce(ckpt, producer)
    _produce(ckpt, producer, error=True)
    ckpt.seal_open()
    producer.ack()
    with pytest.raises(DeliveryFailed, match="recs"):
        ckpt.commit_ready()
    assert consumer.commits == []
    assert ckpt.committed == {}


def test_delivery_error_commits_earlier_checkpoints_only(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _batch(ckpt, producer, 0)
    _batch(ckpt, producer, 1, error=True)
    _batch(ckpt, producer, 2)
    producer.ack()
    with pytest.raises(DeliveryFailed):
        ckpt.commit_ready()
    assert consumer.offsets == [{(T, 0): 1}]
    # The poisoned checkpoint stays: nothing at or after it is ever committed.
    with pytest.raises(DeliveryFailed):
        ckpt.commit_ready()
    with pytest.raises(DeliveryFailed):
        ckpt.flush_and_commit(1.0)
    assert consumer.offsets == [{(T, 0): 1}]
    assert ckpt.committed == {(T, 0): 1}


def test_error_is_reported_only_once_the_checkpoint_is_done(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _consume(ckpt, 0, 0)
    _produce(ckpt, producer, error=True)
    _produce(ckpt, producer)
    ckpt.seal_open()
    producer.ack(1)  # the failed one; the other is still in flight
    assert ckpt.commit_ready() == 0
    producer.ack()
    with pytest.raises(DeliveryFailed):
        ckpt.commit_ready()
    assert consumer.commits == []


def test_forget_drops_partitions_from_open_and_sealed(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _consume(ckpt, 0, 0)
    _consume(ckpt, 1, 0)
    _produce(ckpt, producer)
    ckpt.seal_open()
    _consume(ckpt, 0, 1)
    _consume(ckpt, 1, 1)
    _consume(ckpt, 2, 5)
    _produce(ckpt, producer)
    ckpt.forget([(T, 1), (T, 9)])
    ckpt.seal_open()
    producer.ack()
    assert ckpt.commit_ready() == 2
    assert consumer.offsets == [{(T, 0): 2, (T, 2): 6}]


def test_forget_everything_still_completes_checkpoint(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _batch(ckpt, producer, 0)
    ckpt.forget([(T, 0)])
    producer.ack()
    assert ckpt.commit_ready() == 1
    assert consumer.commits == []


def test_seal_with_nothing_is_a_noop(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    ckpt.seal_open()
    ckpt.seal_open()
    assert producer.polls == []
    assert ckpt.commit_ready() == 0
    assert ckpt.in_flight == 0
    assert consumer.commits == []
    ckpt.flush_and_commit(1.0)
    assert consumer.commits == []


def test_commit_ready_polls_the_producer_without_blocking(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _consume(ckpt, 0, 0)
    ckpt.seal_open()
    assert ckpt.commit_ready() == 1  # no records produced: done at once (e.g. all filtered)
    assert producer.polls == [0]
    assert consumer.offsets == [{(T, 0): 1}]


def test_consumed_keeps_the_last_offset_of_each_partition(
    ckpt: Checkpointer, consumer: FakeConsumer
) -> None:
    ckpt.consumed(T, np.array([0, 1, 0, 2, 1]), np.array([5, 9, 6, 0, 10]))
    assert ckpt.open.next_offsets == {(T, 0): 7, (T, 1): 11, (T, 2): 1}
    ckpt.consumed(T, np.array([2, 0]), np.array([1, 7]))
    assert ckpt.open.next_offsets == {(T, 0): 8, (T, 1): 11, (T, 2): 2}
    # nothing committed: an abort goes back to where each partition was first consumed
    assert ckpt.abort() == {(T, 0): 5, (T, 1): 9, (T, 2): 0}


def test_records_without_offsets_still_seal(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _produce(ckpt, producer)
    ckpt.seal_open()
    _batch(ckpt, producer, 4)
    producer.ack(1)
    assert ckpt.commit_ready() == 1
    assert consumer.commits == []
    producer.ack()
    assert ckpt.commit_ready() == 1
    assert consumer.offsets == [{(T, 0): 5}]


def test_flush_and_commit_seals_flushes_and_commits_synchronously(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _batch(ckpt, producer, 0)
    _consume(ckpt, 0, 1)
    _consume(ckpt, 1, 3)
    _produce(ckpt, producer, 2)  # the open checkpoint is sealed by flush_and_commit
    ckpt.flush_and_commit(7.5)
    assert producer.flushes == [7.5]
    assert consumer.commits == [({(T, 0): 2, (T, 1): 4}, False)]
    assert ckpt.in_flight == 0


def test_flush_and_commit_with_undelivered_records_raises(
    consumer: FakeConsumer,
) -> None:
    producer = FakeProducer(stuck_on_flush=1)
    ckpt = Checkpointer(edge_consumer(consumer), edge_producer(producer))
    _consume(ckpt, 0, 0)
    _produce(ckpt, producer, 2)
    with pytest.raises(DeliveryFailed, match="1 records still undelivered"):
        ckpt.flush_and_commit(0.1)
    assert consumer.commits == []


def test_max_sealed_back_pressure_polls_until_below_limit(consumer: FakeConsumer) -> None:
    producer = FakeProducer(acks_per_poll=1)
    ckpt = Checkpointer(edge_consumer(consumer), edge_producer(producer), max_sealed=2)
    for offset in range(2):
        _batch(ckpt, producer, offset)
    assert ckpt.commit_ready() == 0
    assert producer.polls == [0]  # at the limit: no waiting
    assert consumer.commits == []
    _batch(ckpt, producer, 2)
    assert ckpt.commit_ready() == 1  # 3 sealed > 2: waits for acks
    assert [p for p in producer.polls if p > 0] == [0.05]
    assert consumer.offsets == [{(T, 0): 1}]
    assert ckpt.in_flight == 2


def test_back_pressure_waits_as_long_as_needed(consumer: FakeConsumer) -> None:
    producer = FakeProducer(acks_per_poll=1)
    ckpt = Checkpointer(edge_consumer(consumer), edge_producer(producer), max_sealed=1)
    _consume(ckpt, 0, 0)
    _produce(ckpt, producer, 3)  # three acks needed before the first checkpoint is done
    ckpt.seal_open()
    _batch(ckpt, producer, 1)
    ckpt.commit_ready()
    assert [p for p in producer.polls if p > 0] == [0.05, 0.05, 0.05]
    assert consumer.offsets == [{(T, 0): 1}]
    assert ckpt.in_flight == 1


def test_back_pressure_surfaces_delivery_failure(consumer: FakeConsumer) -> None:
    producer = FakeProducer(acks_per_poll=1)
    ckpt = Checkpointer(edge_consumer(consumer), edge_producer(producer), max_sealed=1)
    _batch(ckpt, producer, 0, error=True)
    _batch(ckpt, producer, 1)
    with pytest.raises(DeliveryFailed):
        ckpt.commit_ready()
    assert consumer.commits == []


def test_callback_belongs_to_the_open_checkpoint_at_produce_time(
    ckpt: Checkpointer, consumer: FakeConsumer, producer: FakeProducer
) -> None:
    _consume(ckpt, 0, 0)
    _produce(ckpt, producer)
    ckpt.seal_open()
    _consume(ckpt, 0, 1)
    _produce(ckpt, producer)
    ckpt.seal_open()
    (first, _), (second, _) = producer.pending
    second(None, FakeMessage("recs"))
    assert ckpt.commit_ready() == 0
    first(None, FakeMessage("recs"))
    assert ckpt.commit_ready() == 2
    assert consumer.offsets == [{(T, 0): 2}]


def _confirmed(
    consumer: FakeConsumer, producer: FakeProducer
) -> tuple[Checkpointer, CommitResults]:
    results = CommitResults()
    ckpt = Checkpointer(edge_consumer(consumer), edge_producer(producer), commit_results=results)
    return ckpt, results


def _commit_one(ckpt: Checkpointer, producer: FakeProducer, offset: int) -> None:
    _batch(ckpt, producer, offset)
    producer.ack()
    ckpt.commit_ready()


def test_committed_advances_only_when_the_broker_confirms(
    consumer: FakeConsumer, producer: FakeProducer
) -> None:
    ckpt, results = _confirmed(consumer, producer)
    _commit_one(ckpt, producer, 4)
    assert consumer.offsets == [{(T, 0): 5}]
    assert ckpt.committed == {}  # sent, not confirmed
    results(None, [TopicPartition(T, 0, 5)])
    assert ckpt.committed == {(T, 0): 5}


def test_a_failed_commit_is_counted_and_retried_with_the_next_commit(
    consumer: FakeConsumer, producer: FakeProducer
) -> None:
    ckpt, results = _confirmed(consumer, producer)
    ckpt.consumed("other", np.array([3]), np.array([9]))
    _commit_one(ckpt, producer, 4)
    results(KafkaError(KafkaError.REQUEST_TIMED_OUT), [TopicPartition(T, 0, 5)])
    assert ckpt.committed == {} and ckpt.commit_failures == 1
    _commit_one(ckpt, producer, 7)  # the next commit carries the failed partitions too
    assert consumer.offsets[-1] == {(T, 0): 8}
    results(None, [TopicPartition(T, 0, 8)])
    assert ckpt.committed == {(T, 0): 8}


def test_a_failed_commit_of_an_idle_partition_is_retried_on_its_own(
    consumer: FakeConsumer, producer: FakeProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt, results = _confirmed(consumer, producer)
    _commit_one(ckpt, producer, 4)
    results(KafkaError(KafkaError.REQUEST_TIMED_OUT), [TopicPartition(T, 0, 5)])
    ckpt.commit_ready()
    assert len(consumer.commits) == 1  # not before RETRY_COMMIT_S
    monkeypatch.setattr("pipeline.stages.commit.protocol.RETRY_COMMIT_S", 0.0)
    results(KafkaError(KafkaError.REQUEST_TIMED_OUT), [TopicPartition(T, 0, 5)])
    ckpt.commit_ready()
    assert consumer.offsets[-1] == {(T, 0): 5} and len(consumer.commits) == 2
    assert ckpt.commit_failures == 2
    results(None, [TopicPartition(T, 0, 5)])
    ckpt.commit_ready()
    assert ckpt.committed == {(T, 0): 5} and len(consumer.commits) == 2


def test_an_unanswered_asynchronous_commit_is_not_done_and_the_stop_commits_it_again(
    consumer: FakeConsumer, producer: FakeProducer
) -> None:
    # During a rebalance the broker can hold an asynchronous commit for seconds and then refuse
    # it: until its result comes, its offsets are uncommitted and a synchronous commit carries
    # them (a stop must not rest on it).
    ckpt, results = _confirmed(consumer, producer)
    ckpt.consumed(T, np.array([0, 1, 1]), np.array([0, 0, 6]))
    _produce(ckpt, producer)
    ckpt.seal_open()
    producer.ack()
    ckpt.commit_ready()
    assert consumer.commits == [({(T, 0): 1, (T, 1): 7}, True)]
    assert ckpt.uncommitted_events() == 1 + 7  # sent, not answered
    ckpt.flush_and_commit(timeout_s=0.1)
    assert consumer.commits[-1] == ({(T, 0): 1, (T, 1): 7}, False)
    assert ckpt.committed == {(T, 0): 1, (T, 1): 7} and ckpt.uncommitted_events() == 0
    results(KafkaError(KafkaError.ILLEGAL_GENERATION), [TopicPartition(T, 0, 1)])  # too late
    assert ckpt.uncommitted_events() == 0 and ckpt.commit_error is not None
    ckpt.flush_and_commit(timeout_s=0.1)
    assert len(consumer.commits) == 2  # nothing more to commit


def _two_commits_in_flight(
    consumer: FakeConsumer, producer: FakeProducer
) -> tuple[Checkpointer, CommitResults]:
    """Partition 0's offsets 4 and 5, each committed asynchronously, neither answered yet."""
    ckpt, results = _confirmed(consumer, producer)
    _commit_one(ckpt, producer, 4)
    _commit_one(ckpt, producer, 5)
    return ckpt, results


def test_an_answered_asynchronous_commit_is_not_sent_again(
    consumer: FakeConsumer, producer: FakeProducer
) -> None:
    ckpt, results = _two_commits_in_flight(consumer, producer)
    results(None, [TopicPartition(T, 0, 5)])  # the first answered, the second still in flight
    assert ckpt.uncommitted_events() == 1
    results(None, [TopicPartition(T, 0, 6)])
    assert ckpt.uncommitted_events() == 0
    ckpt.flush_and_commit(timeout_s=0.1)
    assert [asynchronous for _, asynchronous in consumer.commits] == [True, True]  # no more


def test_a_refused_asynchronous_commit_is_retried_unless_a_later_one_is_in_flight(
    consumer: FakeConsumer, producer: FakeProducer
) -> None:
    ckpt, results = _two_commits_in_flight(consumer, producer)
    results(KafkaError(KafkaError.ILLEGAL_GENERATION), [TopicPartition(T, 0, 5)])
    assert ckpt.uncommitted_events() == 2  # the refused one is kept, the later one in flight
    results(None, [TopicPartition(T, 0, 6)])
    assert ckpt.uncommitted_events() == 0 and ckpt.committed == {(T, 0): 6}


def test_a_late_refusal_of_a_partition_handed_over_since_is_not_retried(
    consumer: FakeConsumer, producer: FakeProducer
) -> None:
    # committing it again could move its new owner's offsets back
    ckpt, results = _confirmed(consumer, producer)
    ckpt.consumed(T, np.array([0, 1]), np.array([4, 4]))
    _produce(ckpt, producer)
    ckpt.seal_open()
    producer.ack()
    ckpt.commit_ready()
    assert ckpt.handed_over({(T, 1)}) == 1  # sent, not answered: uncommitted
    refused = [TopicPartition(T, 0, 5), TopicPartition(T, 1, 5)]
    results(KafkaError(KafkaError.ILLEGAL_GENERATION), refused)
    assert ckpt.uncommitted_events() == 1  # partition 0's
    ckpt.flush_and_commit(timeout_s=0.1)
    assert consumer.commits[-1] == ({(T, 0): 5}, False)


def test_a_failed_synchronous_commit_is_kept_for_retry(producer: FakeProducer) -> None:
    class FailingConsumer(FakeConsumer):
        def commit(self, *args: Any, **kwargs: Any) -> None:
            super().commit(*args, **kwargs)
            raise KafkaException(KafkaError(KafkaError.REQUEST_TIMED_OUT))

    consumer = FailingConsumer()
    ckpt, _ = _confirmed(consumer, producer)
    _consume(ckpt, 0, 4)
    _produce(ckpt, producer)
    producer.stuck_on_flush = 0
    ckpt.flush_and_commit(timeout_s=0.1)
    assert ckpt.committed == {} and ckpt.commit_failures == 1
    ckpt.forget([(T, 0)])  # a lost partition's retry is dropped
    ckpt.flush_and_commit(timeout_s=0.1)
    assert len(consumer.commits) == 1


def test_waits_end_at_the_shutdown_deadline(consumer: FakeConsumer) -> None:
    producer = FakeProducer(stuck_on_flush=1)  # the broker never acknowledges
    shutdown = Shutdown(0.2)
    ckpt = Checkpointer(
        edge_consumer(consumer), edge_producer(producer), max_sealed=1, shutdown=shutdown
    )
    for offset in range(3):
        _batch(ckpt, producer, offset)
    shutdown.request()
    with pytest.raises(DeliveryFailed, match="shutdown deadline"):
        ckpt.commit_ready()  # 3 sealed > 1: waits for acks that never come, until the deadline
    with pytest.raises(DeliveryFailed, match="undelivered"):
        ckpt.flush_and_commit(30.0)
    assert producer.flushes[-1] == 0.0  # the deadline, not the 30 s, bounded the flush


def test_commits_at_most_once_per_commit_interval(
    consumer: FakeConsumer, producer: FakeProducer, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr("pipeline.stages.commit.protocol.time.monotonic", lambda: clock[0])
    ckpt = Checkpointer(
        edge_consumer(consumer), edge_producer(producer), max_sealed=100, commit_interval_s=0.1
    )

    def batch(offset: int) -> None:
        _batch(ckpt, producer, offset)
        producer.ack(1)

    batch(0)
    assert ckpt.commit_ready() == 1 and consumer.offsets == [{(T, 0): 1}]
    for offset in (1, 2, 3):  # acknowledged batches 10 ms apart: no commit request yet
        clock[0] += 0.01
        batch(offset)
        assert ckpt.commit_ready() == 0
    clock[0] += 0.07  # 100 ms after the last commit: one request for all three
    assert ckpt.commit_ready() == 3 and consumer.offsets[-1] == {(T, 0): 4}
    assert len(consumer.commits) == 2
    batch(4)
    ckpt.flush_and_commit(1.0)  # shutdown and revocation commit at once
    assert consumer.offsets[-1] == {(T, 0): 5}


def test_acknowledged_checkpoints_waiting_for_the_interval_do_not_count_as_in_flight(
    consumer: FakeConsumer, producer: FakeProducer
) -> None:
    ckpt = Checkpointer(
        edge_consumer(consumer), edge_producer(producer), max_sealed=1, commit_interval_s=3600
    )
    for offset in range(5):
        _batch(ckpt, producer, offset)
        producer.ack(1)
        ckpt.commit_ready()
    assert [p for p in producer.polls if p > 0] == []  # never waited for acks
    assert len(consumer.commits) == 1  # the first one; the rest wait for the interval
