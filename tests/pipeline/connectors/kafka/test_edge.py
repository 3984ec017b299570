"""The Kafka edge against fakes of librdkafka's clients: a poll becomes one PolledBatch (columns,
client errors left out or raised), rebalances and commits speak (topic, partition), commit
results and errors come back as KafkaClientError, a batch's records are acknowledged to their
checkpoint."""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, KafkaException, TopicPartition

from pipeline.connectors.kafka.consumer import CommitResults, InputConsumer
from pipeline.connectors.kafka.errors import KafkaClientError
from pipeline.types import Checkpoint, Partition
from tests.pipeline.fakes import FakeConsumer, FakeMessage, FakeProducer, edge_producer

T = "in"


def test_a_poll_becomes_columns_in_consumption_order() -> None:
    messages = [
        FakeMessage(T, b"abc", 2, 40, _key=b"k", _headers=[("h", b"v")],
                    _timestamp=(TIMESTAMP_CREATE_TIME, 1_700_000_000_123)),
        FakeMessage(T, None, 0, 7),
        FakeMessage(T, b"", 1, 9, _timestamp=(TIMESTAMP_CREATE_TIME, 0)),
    ]  # fmt: skip
    consumer = InputConsumer(FakeConsumer(messages=deque(messages)))
    polled = consumer.consume(10, 0)
    assert polled.topic == T and len(polled) == 3
    assert polled.values == [b"abc", None, b""]
    assert polled.value_lengths.tolist() == [3, -1, 0]
    assert polled.keys == [b"k", None, None]
    assert polled.partitions.tolist() == [2, 0, 1] and polled.offsets.tolist() == [40, 7, 9]
    assert polled.timestamps_ms.tolist() == [1_700_000_000_123, -1, -1]  # none given: -1
    assert polled.headers == [[("h", b"v")], None, None]
    whole = polled.message(0)
    assert (whole.topic, whole.partition, whole.offset, whole.key, whole.value) == (
        T, 2, 40, b"k", b"abc",
    )  # fmt: skip
    assert len(consumer.consume(10, 0)) == 0


def test_client_errors_are_left_out_logged_or_raised(caplog: pytest.LogCaptureFixture) -> None:
    eof = FakeMessage(T, _error=KafkaError(KafkaError._PARTITION_EOF))
    transient = FakeMessage(T, _error=KafkaError(KafkaError._TRANSPORT))
    only_errors = InputConsumer(FakeConsumer(messages=deque([eof, transient])))
    assert len(only_errors.consume(10, 0)) == 0
    assert caplog.text.count("consumer error") == 1  # the end of a partition is not an error
    fatal = FakeMessage(T, _error=KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    consumer = InputConsumer(FakeConsumer(messages=deque([FakeMessage(T, b"x"), fatal])))
    with pytest.raises(KafkaClientError, match="fenced") as raised:
        consumer.consume(10, 0)
    assert raised.value.fatal and raised.value.name == "_FATAL"


def test_rebalances_seeks_and_pauses_speak_topic_and_partition() -> None:
    fake = FakeConsumer()
    consumer = InputConsumer(fake)
    seen: list[tuple[str, set[Partition]]] = []
    consumer.subscribe(
        T,
        lambda p: seen.append(("assign", p)),
        lambda p: seen.append(("revoke", p)),
        lambda p: seen.append(("lost", p)),
    )
    fake.rebalance("on_assign", [(T, 0), (T, 1)])
    fake.rebalance("on_revoke", [(T, 1)])
    fake.rebalance("on_lost", [(T, 0)])
    assert seen == [("assign", {(T, 0), (T, 1)}), ("revoke", {(T, 1)}), ("lost", {(T, 0)})]
    consumer.seek((T, 1), 42)
    consumer.pause([(T, 0)])
    consumer.resume([(T, 0)])
    assert fake.seeks == [(T, 1, 42)] and fake.paused == [[(T, 0)]] == fake.resumed


class RevokingConsumer(FakeConsumer):
    """Revokes ``revoke`` inside the first ``consume`` call, after that call's messages were
    collected, as librdkafka's batch consume can: they come back after the callback."""

    def __init__(self, messages: list[FakeMessage], revoke: list[tuple[str, int]]) -> None:
        super().__init__(messages=deque(messages))
        self.revoke = revoke

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        taken = super().consume(num_messages, timeout)
        if self.revoke:
            self.rebalance("on_revoke", self.revoke)
            self.revoke = []
        return taken


def test_messages_of_partitions_no_longer_assigned_are_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO")
    messages = [FakeMessage(T, b"a", 0, 0), FakeMessage(T, b"b", 1, 5), FakeMessage(T, b"c", 0, 1)]
    fake = RevokingConsumer(messages, revoke=[(T, 0)])
    consumer = InputConsumer(fake)
    revoked: list[set[Partition]] = []
    consumer.subscribe(T, lambda p: None, revoked.append, lambda p: None)
    fake.rebalance("on_assign", [(T, 0), (T, 1)])
    polled = consumer.consume(10, 0)  # partition 0 is revoked while this poll runs
    assert revoked == [{(T, 0)}]
    assert polled.partitions.tolist() == [1] and polled.offsets.tolist() == [5]
    assert "dropped 2 polled messages of partitions no longer assigned" in caplog.text
    # a later poll too (a message fetched before the revocation), and one of a lost partition
    fake.messages.extend([FakeMessage(T, b"d", 0, 2), FakeMessage(T, b"e", 1, 6)])
    assert consumer.consume(10, 0).offsets.tolist() == [6]
    fake.rebalance("on_lost", [(T, 1)])
    fake.messages.extend([FakeMessage(T, b"f", 1, 7)])
    assert len(consumer.consume(10, 0)) == 0
    # partitions assigned again are consumed again (their next owner is this member)
    fake.rebalance("on_assign", [(T, 0), (T, 1)])
    fake.messages.extend([FakeMessage(T, b"g", 0, 0), FakeMessage(T, b"h", 1, 9)])
    assert consumer.consume(10, 0).offsets.tolist() == [0, 9]


def test_a_partition_beyond_those_ever_assigned_is_not_dropped() -> None:
    fake = FakeConsumer(messages=deque([FakeMessage(T, b"a", 7, 3)]))
    consumer = InputConsumer(fake)
    consumer.subscribe(T, lambda p: None, lambda p: None, lambda p: None)
    fake.rebalance("on_revoke", [(T, 2)])
    assert consumer.consume(10, 0).partitions.tolist() == [7]


def test_commits_and_their_results() -> None:
    fake = FakeConsumer()
    consumer = InputConsumer(fake)
    consumer.commit({(T, 0): 5, (T, 1): 3})
    assert fake.commits == [({(T, 0): 5, (T, 1): 3}, True)]
    assert consumer.commit_sync({(T, 0): 6}) == {}
    assert fake.commits[-1] == ({(T, 0): 6}, False)
    got: list[Any] = []
    results = CommitResults()
    results(None, [TopicPartition(T, 0, 5)])  # no listener yet: dropped
    results.listener = lambda error, offsets, errors: got.append((error, offsets, errors))
    results(None, [TopicPartition(T, 0, 5), TopicPartition(T, 1, 3)])
    ((error, offsets, errors),) = got
    assert error is None and offsets == {(T, 0): 5, (T, 1): 3} and errors == {}
    results(KafkaError(KafkaError.REQUEST_TIMED_OUT, retriable=True), [TopicPartition(T, 0, 5)])
    assert got[-1][0].retriable and got[-1][1] == {(T, 0): 5} and got[-1][2] == {}


def test_a_failed_call_raises_our_error() -> None:
    class Refusing(FakeConsumer):
        def commit(self, *args: Any, **kwargs: Any) -> None:
            raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION))

    with pytest.raises(KafkaClientError) as raised:
        InputConsumer(Refusing()).commit_sync({(T, 0): 1})
    assert raised.value.group_busy and raised.value.name == "ILLEGAL_GENERATION"


def test_a_batch_is_sent_in_order_and_acknowledged_to_its_checkpoint() -> None:
    fake = FakeProducer()
    producer = edge_producer(fake)
    checkpoint = Checkpoint()
    checkpoint.expect(3)
    assert producer.send("out", [b"a", b"b", b"c"], [b"1", None, b"3"], checkpoint) == 3
    assert [(r.value(), r.key()) for r in fake.records] == [(b"a", b"1"), (b"b", None),
                                                           (b"c", b"3")]  # fmt: skip
    fake.failures.append(KafkaError(KafkaError._MSG_TIMED_OUT))
    fake.ack(0)
    assert checkpoint.pending == 3
    fake.ack()
    assert checkpoint.pending == 0 and checkpoint.error is None
    failed = Checkpoint()
    failed.expect(1)
    fake.failures.append(KafkaError(KafkaError._MSG_TIMED_OUT))
    assert producer.send_one("dlq", b"x", None, [("h", b"v")], failed)
    assert fake.records[-1].headers() == [("h", b"v")]
    fake.ack()
    assert failed.pending == 0 and failed.error is not None and "failed" in failed.error


def test_polled_columns_cut_and_join_in_step() -> None:
    messages = [FakeMessage(T, bytes([i]), i % 2, 10 + i) for i in range(5)]
    polled = InputConsumer(FakeConsumer(messages=deque(messages))).consume(10, 0)
    head, tail = polled.slice(0, 2), polled.slice(2)
    joined = type(polled).concat([head, tail])
    assert joined.offsets.tolist() == polled.offsets.tolist() and joined.values == polled.values
    odd = polled.where(polled.partitions == 1)
    assert odd.offsets.tolist() == [11, 13] and odd.values == [b"\x01", b"\x03"]
    assert polled.in_partitions({(T, 1), ("other", 0)}).tolist() == [False, True] * 2 + [False]
    taken = polled.take(np.array([4, 0], dtype=np.int64))
    assert taken.offsets.tolist() == [14, 10] and taken.values == [b"\x04", b"\x00"]
    assert polled.where(np.ones(5, dtype=bool)) is polled
