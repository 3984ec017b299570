"""The source stage against a fake consumer: backlog, client errors, assignment, activity."""

from __future__ import annotations

from collections import deque

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline.stages.source import KafkaSource
from tests.pipeline.fakes import FakeConsumer, FakeMessage

T = "in"


def _source(
    messages: list[FakeMessage], max_messages: int = 10
) -> tuple[KafkaSource, FakeConsumer]:
    consumer = FakeConsumer(messages=deque(messages))
    return KafkaSource(consumer, T, max_messages), consumer


def test_poll_fills_a_bounded_backlog_and_records_activity() -> None:
    source, _ = _source([FakeMessage(T, b"x", 0, i) for i in range(5)], max_messages=3)
    assert source.last_activity is None and source.first_input_at is None
    assert source.poll(0.0) == 3
    assert source.backlog == 3
    assert source.last_activity is not None
    first = source.first_input_at
    assert source.poll(0.0) == 2
    assert source.first_input_at == first
    assert [m.offset() for m in source.take(3)] == [0, 1, 2]
    assert [m.offset() for m in source.take(10)] == [3, 4]
    assert source.take(1) == []


def test_end_of_partition_is_skipped_and_other_errors_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    eof = FakeMessage(T, _error=KafkaError(KafkaError._PARTITION_EOF))
    transient = FakeMessage(T, _error=KafkaError(KafkaError._TRANSPORT))
    source, _ = _source([eof, transient, FakeMessage(T, b"x", 0, 9)])
    source.poll(0.0)
    assert [m.offset() for m in source.take(10)] == [9]
    assert "consumer error" in caplog.text
    assert source.take(10) == []


def test_fatal_client_error_raises() -> None:
    fatal = FakeMessage(T, _error=KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    source, _ = _source([fatal])
    source.poll(0.0)
    with pytest.raises(KafkaException):
        source.take(1)


def test_revocation_drops_the_backlog_of_revoked_partitions_only() -> None:
    messages = [FakeMessage(T, b"x", p, o) for o in range(3) for p in (0, 1)]
    source, _ = _source(messages)
    source.assigned({(T, 0), (T, 1)})
    source.poll(0.0)
    assert source.revoked({(T, 1)}) == 3
    assert source.assignment == {(T, 0)}
    kept = [(m.partition(), m.offset()) for m in source.take(10)]
    assert kept == [(0, 0), (0, 1), (0, 2)]


def test_subscribe_passes_the_rebalance_callbacks_and_close_closes() -> None:
    source, consumer = _source([])
    calls: list[str] = []
    source.subscribe(
        lambda c, p: calls.append("assign"),
        lambda c, p: calls.append("revoke"),
        lambda c, p: calls.append("lost"),
    )
    consumer.rebalance("on_revoke", [(T, 0)])
    consumer.rebalance("on_lost", [(T, 0)])
    consumer.rebalance("on_assign", [(T, 0)])
    assert calls == ["revoke", "lost", "assign"]
    source.close()
    assert consumer.closed
