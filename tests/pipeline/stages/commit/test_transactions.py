"""The exactly-once commit protocol against a fake transactional producer."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException

from model.rank import RankContext
from pipeline.config import KafkaSettings, Settings
from pipeline.delivery_settings import DeliverySettings, Guarantee
from pipeline.records import DeliveryFailed
from pipeline.stages.commit import TransactionalCheckpointer, transactional_kafka
from tests.pipeline.fakes import FakeConsumer, FakeProducer

T = "events"


class TxnProducer(FakeProducer):
    """Records the transactional calls in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.sent_offsets: list[dict[tuple[str, int], int]] = []
        self.fail_commit = False

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(
        self, offsets: list[Any], metadata: Any, timeout: float
    ) -> None:
        assert metadata == "group-metadata"
        self.sent_offsets.append({(tp.topic, tp.partition): tp.offset for tp in offsets})
        self.calls.append("offsets")

    def commit_transaction(self, timeout: float) -> None:
        if self.fail_commit:
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced"))
        self.calls.append("commit")

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")


class GroupConsumer(FakeConsumer):
    def consumer_group_metadata(self) -> str:
        return "group-metadata"


def _checkpointer(interval_s: float = 60.0) -> tuple[TransactionalCheckpointer, TxnProducer]:
    producer = TxnProducer()
    ckpt = TransactionalCheckpointer(GroupConsumer(), producer, interval_s, max_sealed=2)
    return ckpt, producer


def _batch(ckpt: TransactionalCheckpointer, producer: TxnProducer, offset: int) -> None:
    ckpt.consumed(T, np.array([0]), np.array([offset]))
    checkpoint = ckpt.cut()
    producer.produce("recs", b"", on_delivery=checkpoint.expect_delivery())
    checkpoint.seal()


def test_records_and_offsets_commit_together_once_the_interval_passed() -> None:
    ckpt, producer = _checkpointer(interval_s=0.05)
    _batch(ckpt, producer, 4)
    assert producer.calls == ["init", "begin"]  # begun before the first record
    assert ckpt.commit_ready() == 0  # within the interval
    time.sleep(0.06)
    assert ckpt.commit_ready() == 1
    assert producer.calls == ["init", "begin", "offsets", "commit"]
    assert producer.sent_offsets == [{(T, 0): 5}]
    assert ckpt.committed == {(T, 0): 5}


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


def test_a_failed_commit_aborts_and_stops_the_run() -> None:
    ckpt, producer = _checkpointer()
    _batch(ckpt, producer, 0)
    producer.fail_commit = True
    with pytest.raises(DeliveryFailed, match="fenced"):
        ckpt.commit_delivered(1.0)
    assert producer.calls[-1] == "abort" and ckpt.committed == {}


def test_transactional_settings_derive_a_stable_id_per_rank() -> None:
    settings = Settings(
        kafka=KafkaSettings(group_id="g", client_id="c"),
        delivery=DeliverySettings(guarantee=Guarantee.EXACTLY_ONCE),
    )
    kafka = transactional_kafka(settings, RankContext(rank=1, world_size=2))
    assert kafka.producer_config()["transactional.id"] == "g-c-1"
    assert kafka.consumer_config()["isolation.level"] == "read_committed"
