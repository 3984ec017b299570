"""The source stage against a fake consumer: backlog, consume pattern, arrival times, client
errors, assignment, activity."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, KafkaError, Message

from pipeline.connectors.kafka.errors import KafkaClientError
from pipeline.stages.source import KafkaSource
from tests.pipeline.fakes import FakeConsumer, FakeMessage, edge_consumer

T = "in"


def _source(messages: list[Message], max_messages: int = 10) -> tuple[KafkaSource, FakeConsumer]:
    consumer = FakeConsumer(messages=deque(messages))
    return KafkaSource(edge_consumer(consumer), T, max_messages), consumer


def test_poll_fills_a_bounded_backlog_and_records_activity() -> None:
    source, _ = _source([FakeMessage(T, b"x", 0, i) for i in range(5)], max_messages=3)
    assert source.last_activity is None and source.first_input_at is None
    assert source.poll(0.0) == 3
    assert source.backlog == 3
    assert source.last_activity is not None
    first = source.first_input_at
    assert source.poll(0.0) == 2
    assert source.first_input_at == first
    assert source.take(3).offsets.tolist() == [0, 1, 2]
    assert source.take(10).offsets.tolist() == [3, 4]
    assert len(source.take(1)) == 0


def test_end_of_partition_is_skipped_and_other_errors_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    eof = FakeMessage(T, _error=KafkaError(KafkaError._PARTITION_EOF))
    transient = FakeMessage(T, _error=KafkaError(KafkaError._TRANSPORT))
    source, _ = _source([eof, transient, FakeMessage(T, b"x", 0, 9)])
    assert source.poll(0.0) == 1  # the errors are not messages
    assert source.take(10).offsets.tolist() == [9]
    assert "consumer error" in caplog.text
    assert len(source.take(10)) == 0


def test_fatal_client_error_raises() -> None:
    fatal = FakeMessage(T, _error=KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    source, _ = _source([fatal])
    with pytest.raises(KafkaClientError, match="fenced") as raised:
        source.poll(0.0)
    assert raised.value.fatal


def test_revocation_drops_the_backlog_of_revoked_partitions_only() -> None:
    messages = [FakeMessage(T, b"x", p, o) for o in range(3) for p in (0, 1)]
    source, _ = _source(messages)
    source.assigned({(T, 0), (T, 1)})
    source.poll(0.0)
    source.last_activity = before = time.monotonic() - 60  # the last input, a minute ago
    assert source.revoked({(T, 1)}) == 3
    # A revoked or lost assignment restarts the idle clock: a member that lost its partitions
    # in a broker outage rejoins, it is not idle (--exit-when-idle).
    assert source.last_activity is not None and source.last_activity > before + 59
    assert source.assignment == {(T, 0)}
    kept = source.take(10)
    assert list(zip(kept.partitions.tolist(), kept.offsets.tolist(), strict=True)) == [
        (0, 0),
        (0, 1),
        (0, 2),
    ]


def test_subscribe_passes_the_rebalance_callbacks_and_close_closes() -> None:
    source, consumer = _source([])
    calls: list[tuple[str, set[tuple[str, int]]]] = []
    source.subscribe(
        lambda p: calls.append(("assign", p)),
        lambda p: calls.append(("revoke", p)),
        lambda p: calls.append(("lost", p)),
    )
    consumer.rebalance("on_revoke", [(T, 0)])
    consumer.rebalance("on_lost", [(T, 1)])
    consumer.rebalance("on_assign", [(T, 0), (T, 1)])
    # the callbacks get the partitions as (topic, partition) pairs, never a client type
    assert calls == [("revoke", {(T, 0)}), ("lost", {(T, 1)}), ("assign", {(T, 0), (T, 1)})]
    source.close()
    assert consumer.closed


def test_poll_takes_what_is_queued_without_blocking() -> None:
    source, consumer = _source([FakeMessage(T, b"x", 0, i) for i in range(4)], max_messages=10)
    assert source.poll(0.5) == 4
    assert consumer.consume_calls == [(10, 0)]  # queued messages never wait out the timeout
    assert source.drained  # fewer than asked: the client's queue is empty


def test_poll_blocks_for_one_message_only_when_nothing_is_queued_then_drains() -> None:
    source, consumer = _source([], max_messages=10)
    assert source.poll(0.5) == 0
    assert consumer.consume_calls == [(10, 0), (1, 0.5)]
    consumer.consume_calls.clear()
    consumer.messages.extend(FakeMessage(T, b"x", 0, i) for i in range(3))
    real = consumer.consume
    calls = iter([[], *([None] * 3)])  # the first non-blocking call finds nothing queued yet

    def consume(num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if next(calls) == []:
            consumer.consume_calls.append((num_messages, timeout))
            return []
        return real(num_messages, timeout)

    consumer.consume = consume  # type: ignore[method-assign]
    assert source.poll(0.5) == 3
    assert consumer.consume_calls == [(10, 0), (1, 0.5), (9, 0)]


def test_a_full_poll_is_not_drained() -> None:
    source, _ = _source([FakeMessage(T, b"x", 0, i) for i in range(5)], max_messages=3)
    source.poll(0.0)
    assert not source.drained
    source.poll(0.0)
    assert source.drained


def test_head_arrival_is_the_kafka_timestamp_when_the_message_queued_before_the_poll() -> None:
    now_ms = int(time.time() * 1000)
    queued = FakeMessage(T, b"x", 0, 0, _timestamp=(TIMESTAMP_CREATE_TIME, now_ms - 300))
    future = FakeMessage(T, b"x", 0, 1, _timestamp=(TIMESTAMP_CREATE_TIME, now_ms + 60_000))
    untimed = FakeMessage(T, b"x", 0, 2)
    source, _ = _source([queued], max_messages=1)
    assert source.head_arrival is None
    source.poll(0.0)
    consumed = source.last_activity
    assert consumed is not None and source.head_arrival is not None
    assert 0.25 < consumed - source.head_arrival < 0.5  # it waited ~0.3 s before the poll
    source.take(1)
    assert source.head_arrival is None
    for message in (future, untimed):  # a clock ahead, or no timestamp: consumed now
        source, _ = _source([message], max_messages=1)
        source.poll(0.0)
        assert source.head_arrival == source.last_activity


def test_take_keeps_each_polls_arrival_for_what_is_left() -> None:
    source, consumer = _source([FakeMessage(T, b"x", 0, i) for i in range(3)], max_messages=3)
    source.poll(0.0)
    first = source.head_arrival
    consumer.messages.extend(FakeMessage(T, b"x", 0, i) for i in range(3, 5))
    source.poll(0.0)
    second = source.last_activity
    source.take(2)
    assert source.head_arrival == first  # one message of the first poll is left
    source.take(1)
    assert source.head_arrival == second
