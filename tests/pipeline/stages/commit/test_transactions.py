"""The exactly-once commit protocol against a fake transactional producer and a fake clock:
librdkafka's error classes (retriable, abortable, fatal), calls that never answer, signals, and
the abort that lets the loop go back to the last committed offsets."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException

from model.rank import RankContext
from pipeline.connectors.kafka.producer import OutputProducer
from pipeline.settings.delivery import DeliverySettings, Guarantee
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.loading import Settings
from pipeline.stages.commit import TransactionalCheckpointer, TransactionFailed, transactional_kafka
from pipeline.stages.commit.transactions import transaction_budget_s
from pipeline.types import DeliveryFailed, Shutdown
from tests.pipeline.fakes import edge_consumer, edge_producer
from tests.pipeline.stages.commit.transactional import (
    FakeClock,
    GroupConsumer,
    TxnProducer,
    abortable,
    fatal,
    retriable,
)

T = "events"


def _checkpointer(
    interval_s: float = 60.0,
    timeout_s: float = 30.0,
    clock: FakeClock | None = None,
    shutdown: Shutdown | None = None,
    renew: Callable[[], OutputProducer] | None = None,
) -> tuple[TransactionalCheckpointer, TxnProducer]:
    clock = clock or FakeClock()
    producer = TxnProducer(clock)
    ckpt = TransactionalCheckpointer(
        edge_consumer(GroupConsumer()),
        edge_producer(producer),
        interval_s,
        max_sealed=2,
        timeout_s=timeout_s,
        shutdown=shutdown,
        clock=clock,
        renew=renew,
    )
    return ckpt, producer


def _batch(ckpt: TransactionalCheckpointer, producer: TxnProducer, offset: int) -> None:
    ckpt.consumed(T, np.array([0]), np.array([offset]))
    checkpoint = ckpt.cut()
    checkpoint.expect()  # begins the transaction
    edge_producer(producer).send("recs", [b""], [None], checkpoint)
    checkpoint.seal()


def test_records_and_offsets_commit_together_once_the_interval_passed() -> None:
    clock = FakeClock()
    ckpt, producer = _checkpointer(interval_s=5.0, clock=clock)
    _batch(ckpt, producer, 4)
    assert producer.calls == ["init", "begin"]  # begun before the first record
    clock.advance(4.9)
    assert ckpt.commit_ready() == 0  # within the interval
    clock.advance(0.1)
    assert ckpt.commit_ready() == 1
    assert producer.calls == ["init", "begin", "offsets", "commit"]
    assert producer.sent_offsets == [{(T, 0): 5}]
    assert ckpt.committed == {(T, 0): 5}
    assert ckpt.transactions == 1


def test_a_batch_in_flight_is_left_to_the_next_transaction() -> None:
    ckpt, producer = _checkpointer()
    _batch(ckpt, producer, 4)
    ckpt.consumed(T, np.array([0]), np.array([5]))
    in_flight = ckpt.cut()  # forward running: nothing produced yet
    ckpt.commit_delivered(1.0)  # a forced commit (a revocation)
    assert producer.sent_offsets == [{(T, 0): 5}]
    in_flight.expect()
    edge_producer(producer).send("recs", [b""], [None], in_flight)
    assert producer.calls[-1] == "begin"  # its record opens the next transaction
    in_flight.seal()
    ckpt.flush_and_commit(1.0)
    assert producer.sent_offsets[-1] == {(T, 0): 6}


def test_too_many_sealed_checkpoints_force_a_commit() -> None:
    ckpt, producer = _checkpointer()
    for offset in range(2):
        _batch(ckpt, producer, offset)
    assert ckpt.commit_ready() == 0  # at the limit, within the interval
    _batch(ckpt, producer, 2)
    assert ckpt.commit_ready() == 3  # over it: commit at once
    assert producer.calls.count("commit") == 1
    assert ckpt.committed == {(T, 0): 3}


def test_retriable_errors_are_retried_and_the_transaction_commits() -> None:
    clock = FakeClock()
    producer = TxnProducer(clock)
    producer.scripts["init"] = [retriable()]
    ckpt = TransactionalCheckpointer(
        edge_consumer(GroupConsumer()), edge_producer(producer), 60.0, clock=clock
    )
    _batch(ckpt, producer, 0)
    producer.scripts["offsets"] = [retriable(), retriable(KafkaError._TRANSPORT)]
    producer.scripts["commit"] = [retriable()]
    ckpt.commit_delivered(1.0)
    assert producer.calls == ["init", "init", "begin", *["offsets"] * 3, "commit", "commit"]
    assert ckpt.committed == {(T, 0): 1} and ckpt.aborts == 0


def test_retriable_errors_past_the_budget_give_up_without_aborting() -> None:
    ckpt, producer = _checkpointer(timeout_s=10.0)
    _batch(ckpt, producer, 0)
    producer.scripts["offsets"] = [retriable() for _ in range(100)]
    with pytest.raises(DeliveryFailed, match="not committed"):
        ckpt.commit_delivered(1.0)
    assert producer.calls.count("offsets") == 10  # one fake second each, 10 s of budget
    assert "abort" not in producer.calls  # the broker is unreachable: left to the coordinator
    assert ckpt.committed == {}


def test_an_abortable_error_is_aborted_and_the_loop_goes_back_to_the_committed_offsets() -> None:
    ckpt, producer = _checkpointer()
    _batch(ckpt, producer, 0)
    ckpt.commit_delivered(1.0)  # offset 0 is committed: the next one starts at 1
    _batch(ckpt, producer, 1)
    _batch(ckpt, producer, 2)
    producer.scripts["offsets"] = [abortable()]
    with pytest.raises(TransactionFailed, match="unknown member"):
        ckpt.commit_delivered(1.0)
    with pytest.raises(TransactionFailed):  # nothing more is committed until the abort
        ckpt.commit_ready()
    assert "abort" not in producer.calls
    producer.scripts["abort"] = [retriable()]  # the abort itself is retried
    assert ckpt.abort() == {(T, 0): 1}  # back to the last committed offset, not the first
    assert producer.calls[-2:] == ["abort", "abort"]
    assert ckpt.aborts == 1 and ckpt.committed == {(T, 0): 1} and ckpt.in_flight == 0
    _batch(ckpt, producer, 1)  # consumed again: the next transaction commits it
    ckpt.commit_delivered(1.0)
    assert ckpt.committed == {(T, 0): 2} and producer.sent_offsets[-1] == {(T, 0): 2}


def test_a_fenced_producer_is_fatal_and_not_aborted() -> None:
    ckpt, producer = _checkpointer()
    _batch(ckpt, producer, 0)
    producer.scripts["commit"] = [fatal()]
    with pytest.raises(DeliveryFailed, match=r"producer unusable.*fenced"):
        ckpt.commit_delivered(1.0)
    assert producer.calls[-2:] == ["offsets", "commit"]
    assert ckpt.aborts == 0 and ckpt.committed == {}


def test_an_unclassified_error_is_aborted() -> None:
    ckpt, producer = _checkpointer()
    _batch(ckpt, producer, 0)
    producer.scripts["commit"] = [KafkaException(KafkaError(KafkaError._STATE, "bad state"))]
    with pytest.raises(TransactionFailed, match="bad state"):
        ckpt.commit_delivered(1.0)
    assert ckpt.abort() == {(T, 0): 0}  # nothing committed: back to the first offset consumed
    assert producer.calls[-1] == "abort"


def test_partitions_lost_mid_transaction_fail_it() -> None:
    ckpt, producer = _checkpointer()
    _batch(ckpt, producer, 0)
    with pytest.raises(TransactionFailed, match="lost mid-transaction"):
        ckpt.forget([(T, 0)])
    assert ckpt.abort() == {} and producer.calls[-1] == "abort"


def test_init_transactions_that_never_succeed_fail_the_start() -> None:
    clock = FakeClock()
    producer = TxnProducer(clock)
    producer.scripts["init"] = [retriable() for _ in range(100)]
    with pytest.raises(DeliveryFailed, match="could not initialise"):
        TransactionalCheckpointer(
            edge_consumer(GroupConsumer()), edge_producer(producer), 1.0, timeout_s=5.0, clock=clock
        )
    producer.scripts["init"] = [fatal()]
    with pytest.raises(DeliveryFailed, match="fenced"):
        TransactionalCheckpointer(
            edge_consumer(GroupConsumer()), edge_producer(producer), 1.0, clock=clock
        )


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Lets a blocked fake call return at the end of the test (its thread is a daemon)."""
    event = threading.Event()
    yield event
    event.set()


def test_a_call_that_never_answers_is_given_up_at_its_budget(release: threading.Event) -> None:
    # librdkafka's send_offsets_to_transaction ignores its timeout while the coordinator is
    # down: the loop's thread must not wait for it.
    ckpt, producer = _checkpointer(timeout_s=10.0)
    _batch(ckpt, producer, 0)
    clock = producer.clock

    def hang() -> None:
        clock.advance(20.0)  # the budget is spent while the call blocks
        release.wait()

    producer.scripts["offsets"] = [hang]
    with pytest.raises(TransactionFailed, match="no answer from the broker"):
        ckpt.commit_delivered(1.0)
    assert producer.calls[-1] == "offsets" and "abort" not in producer.calls
    # The abort waits for the call in flight: never two transactional calls at once.
    threading.Timer(0.3, release.set).start()
    ckpt.abort()
    assert producer.calls[-2:] == ["offsets", "abort"] and ckpt.aborts == 1


def test_a_producer_whose_call_never_answers_is_replaced(release: threading.Event) -> None:
    clock = FakeClock()
    fresh = TxnProducer(clock)
    renewed = edge_producer(fresh)
    ckpt, producer = _checkpointer(timeout_s=10.0, clock=clock, renew=lambda: renewed)

    def hang() -> None:
        clock.advance(20.0)
        release.wait()

    _batch(ckpt, producer, 0)
    producer.scripts["offsets"] = [hang]
    with pytest.raises(TransactionFailed, match="no answer from the broker"):
        ckpt.commit_delivered(1.0)
    # The old producer is never called again; the new one's init_transactions fences it (and
    # its coordinator aborts the transaction it left open).
    assert ckpt.abort() == {(T, 0): 0}
    assert "abort" not in producer.calls and fresh.calls == ["init"]
    assert ckpt.producer is renewed and ckpt.aborts == 1
    _batch(ckpt, fresh, 0)
    ckpt.commit_delivered(1.0)
    assert fresh.calls[-2:] == ["offsets", "commit"] and ckpt.committed == {(T, 0): 1}


def test_a_call_gives_up_at_the_shutdown_deadline(release: threading.Event) -> None:
    clock = FakeClock()
    shutdown = Shutdown(5.0, clock=clock)
    ckpt, producer = _checkpointer(timeout_s=30.0, clock=clock, shutdown=shutdown)
    _batch(ckpt, producer, 0)
    shutdown.request()
    producer.scripts["offsets"] = [retriable() for _ in range(100)]
    with pytest.raises(DeliveryFailed, match="not committed"):
        ckpt.commit_delivered(1.0)
    assert producer.calls.count("offsets") == 5  # one fake second each, 5 s to the deadline


def test_a_stop_during_a_call_that_never_answers_ends_the_wait(
    release: threading.Event,
) -> None:
    clock = FakeClock()
    shutdown = Shutdown(2.0, clock=clock)
    ckpt, producer = _checkpointer(timeout_s=30.0, clock=clock, shutdown=shutdown)
    _batch(ckpt, producer, 0)

    def hang_until_stopped() -> None:
        shutdown.request()  # SIGTERM's handler (the pipeline's stop) runs while the call hangs
        clock.advance(2.0)  # the shutdown deadline passes; the 30 s budget does not
        release.wait()

    producer.scripts["offsets"] = [hang_until_stopped]
    with pytest.raises(DeliveryFailed, match="no answer from the broker"):
        ckpt.commit_delivered(1.0)
    assert producer.calls.count("offsets") == 1


def test_transactional_settings_derive_a_stable_id_per_rank() -> None:
    rank = RankContext(rank=1, world_size=2)
    settings = Settings(
        kafka=KafkaSettings(group_id="g", client_id="c"),
        delivery=DeliverySettings(guarantee=Guarantee.EXACTLY_ONCE),
    )
    kafka = transactional_kafka(settings, rank)
    assert kafka.config.producer["transactional.id"] == "g-c-1"
    assert kafka.config.consumer["isolation.level"] == "read_committed"
    # Eager rebalancing: transactions never carry a generation the group has left.
    assert kafka.config.consumer["partition.assignment.strategy"] == "roundrobin"
    chosen = settings.model_copy(
        update={
            "kafka": KafkaSettings(
                group_id="g", consumer_extra={"partition.assignment.strategy": "range"}
            )
        }
    )
    assert transaction_budget_s(kafka.config) == 60.0  # librdkafka's default
    assert transactional_kafka(chosen, rank).config.consumer["partition.assignment.strategy"] == (
        "range"
    )


@pytest.mark.parametrize("timeout_ms", [30_000, "30000"])
def test_the_transaction_budget_is_the_producers_transaction_timeout(
    timeout_ms: int | str,
) -> None:
    settings = Settings(
        kafka=KafkaSettings(producer_extra={"transaction.timeout.ms": timeout_ms}),
        delivery=DeliverySettings(guarantee=Guarantee.EXACTLY_ONCE),
    )
    kafka = transactional_kafka(settings, RankContext())
    assert transaction_budget_s(kafka.config) == 30.0  # a string value as librdkafka reads it
