"""The dead-letter stage against a fake producer: the message untouched, reason headers."""

from __future__ import annotations

from pipeline.observability.metrics import Metrics
from pipeline.stages.dead_letter import DETAIL_HEADER, REASON_HEADER, DeadLetterSink
from pipeline.types import Checkpoint, RejectedMessage, RejectReason
from tests.pipeline.fakes import FakeMessage, FakeProducer, polled, sender


def test_dead_letter_keeps_the_message_and_adds_reason_headers() -> None:
    producer, metrics = FakeProducer(), Metrics()
    message = FakeMessage("in", b"\x01garbage", 3, 17, _key=b"k", _headers=[("trace", b"t-1")])
    checkpoint = Checkpoint()
    rejection = RejectedMessage(RejectReason.UNDECODABLE, "x" * 5000)
    consumed = polled([message]).message(0)
    DeadLetterSink(sender(producer), "dlq", metrics).publish(consumed, rejection, checkpoint)

    (record,) = producer.on_topic("dlq")
    assert record.value() == b"\x01garbage" and record.key() == b"k"
    headers = dict(record.headers() or [])
    assert headers["trace"] == b"t-1"
    assert headers[REASON_HEADER] == b"undecodable"
    assert len(headers[DETAIL_HEADER] or b"") == 1024
    assert headers["x-source-partition"] == b"3" and headers["x-source-offset"] == b"17"
    assert checkpoint.pending == 1
    producer.ack()
    assert checkpoint.pending == 0 and checkpoint.error is None
    assert metrics.dead_lettered.labels(reason="undecodable")._value.get() == 1
