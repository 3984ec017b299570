"""The exactly-once commit protocol against a fake transactional producer and a fake clock:
librdkafka's error classes (retriable, abortable, fatal), calls that never answer, signals."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException

from model.rank import RankContext
from pipeline.settings.delivery import DeliverySettings, Guarantee
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.loading import Settings
from pipeline.stages.commit import TransactionalCheckpointer, transactional_kafka
from pipeline.types import DeliveryFailed, Shutdown
from tests.pipeline.fakes import FakeConsumer, FakeProducer

T = "events"


class FakeClock:
    """Seconds that pass only when a test (or a fake call) says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def retriable(code: int = KafkaError._TIMED_OUT) -> KafkaException:
    return KafkaException(KafkaError(code, "coordinator unreachable", retriable=True))


def abortable() -> KafkaException:
    return KafkaException(
        KafkaError(KafkaError.UNKNOWN_MEMBER_ID, "unknown member", txn_requires_abort=True)
    )


def fatal() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer producer", fatal=True))


Script = list[KafkaException | Callable[[], None]]
"""What the next calls of one transactional method do: raise an error, or run a function (which
may block); the call succeeds once the script is empty."""


class TxnProducer(FakeProducer):
    """Records the transactional calls in order; each call takes ``call_s`` of the fake clock
    and follows its script."""

    def __init__(self, clock: FakeClock, call_s: float = 1.0) -> None:
        super().__init__()
        self.clock = clock
        self.call_s = call_s
        self.calls: list[str] = []
        self.sent_offsets: list[dict[tuple[str, int], int]] = []
        self.scripts: dict[str, Script] = {}

    def _run(self, name: str) -> None:
        self.calls.append(name)
        self.clock.advance(self.call_s)
        script = self.scripts.get(name)
        if script:
            step = script.pop(0)
            if isinstance(step, KafkaException):
                raise step
            step()

    def init_transactions(self, timeout: float) -> None:
        self._run("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(
        self, offsets: list[Any], metadata: Any, timeout: float
    ) -> None:
        assert metadata == "group-metadata"
        self._run("offsets")
        self.sent_offsets.append({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def commit_transaction(self, timeout: float) -> None:
        self._run("commit")

    def abort_transaction(self, timeout: float) -> None:
        self._run("abort")


class GroupConsumer(FakeConsumer):
    def consumer_group_metadata(self) -> str:
        return "group-metadata"


def _checkpointer(
    interval_s: float = 60.0,
    timeout_s: float = 30.0,
    clock: FakeClock | None = None,
    shutdown: Shutdown | None = None,
) -> tuple[TransactionalCheckpointer, TxnProducer]:
    clock = clock or FakeClock()
    producer = TxnProducer(clock)
    ckpt = TransactionalCheckpointer(
        GroupConsumer(),
        producer,
        interval_s,
        max_sealed=2,
        timeout_s=timeout_s,
        shutdown=shutdown,
        clock=clock,
    )
    return ckpt, producer


def _batch(ckpt: TransactionalCheckpointer, producer: TxnProducer, offset: int) -> None:
    ckpt.consumed(T, np.array([0]), np.array([offset]))
    checkpoint = ckpt.cut()
    producer.produce("recs", b"", on_delivery=checkpoint.expect_delivery())
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
    producer.produce("recs", b"", on_delivery=in_flight.expect_delivery())
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
    ckpt = TransactionalCheckpointer(GroupConsumer(), producer, 60.0, clock=clock)
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


def test_an_abortable_error_aborts_and_stops_the_run() -> None:
    ckpt, producer = _checkpointer()
    _batch(ckpt, producer, 0)
    producer.scripts["offsets"] = [abortable()]
    producer.scripts["abort"] = [retriable()]  # the abort itself is retried
    with pytest.raises(DeliveryFailed, match="unknown member"):
        ckpt.commit_delivered(1.0)
    assert producer.calls[-3:] == ["offsets", "abort", "abort"]
    assert ckpt.aborts == 1 and ckpt.committed == {}


def test_a_fenced_producer_is_fatal_and_not_aborted() -> None:
    ckpt, producer = _checkpointer()
    _batch(ckpt, producer, 0)
    producer.scripts["commit"] = [fatal()]
    with pytest.raises(DeliveryFailed, match=r"producer unusable.*fenced"):
        ckpt.commit_delivered(1.0)
    assert producer.calls[-2:] == ["offsets", "commit"]
    assert ckpt.aborts == 0 and ckpt.committed == {}


def test_an_unclassified_error_aborts() -> None:
    ckpt, producer = _checkpointer()
    _batch(ckpt, producer, 0)
    producer.scripts["commit"] = [KafkaException(KafkaError(KafkaError._STATE, "bad state"))]
    with pytest.raises(DeliveryFailed, match="bad state"):
        ckpt.commit_delivered(1.0)
    assert producer.calls[-1] == "abort"


def test_init_transactions_that_never_succeed_fail_the_start() -> None:
    clock = FakeClock()
    producer = TxnProducer(clock)
    producer.scripts["init"] = [retriable() for _ in range(100)]
    with pytest.raises(DeliveryFailed, match="could not initialise"):
        TransactionalCheckpointer(GroupConsumer(), producer, 1.0, timeout_s=5.0, clock=clock)
    producer.scripts["init"] = [fatal()]
    with pytest.raises(DeliveryFailed, match="fenced"):
        TransactionalCheckpointer(GroupConsumer(), producer, 1.0, clock=clock)


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
    with pytest.raises(DeliveryFailed, match="no answer from the broker"):
        ckpt.commit_delivered(1.0)
    assert producer.calls[-1] == "offsets" and "abort" not in producer.calls
    # Any later call fails at once while the abandoned one still runs.
    _batch(ckpt, producer, 1)
    with pytest.raises(DeliveryFailed, match="still in progress"):
        ckpt.commit_delivered(1.0)
    assert producer.calls.count("offsets") == 1


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
    assert kafka.producer_config()["transactional.id"] == "g-c-1"
    assert kafka.consumer_config()["isolation.level"] == "read_committed"
    # Eager rebalancing: transactions never carry a generation the group has left.
    assert kafka.consumer_config()["partition.assignment.strategy"] == "roundrobin"
    chosen = settings.model_copy(
        update={
            "kafka": KafkaSettings(
                group_id="g", consumer_extra={"partition.assignment.strategy": "range"}
            )
        }
    )
    assert transactional_kafka(chosen, rank).consumer_config()["partition.assignment.strategy"] == (
        "range"
    )
