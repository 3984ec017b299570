"""The publish stage against a fake producer: records, keys, headers, acknowledgements."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import CodecSettings
from pipeline.metrics import Metrics
from pipeline.stages.commit import Checkpoint
from pipeline.stages.decode import (
    RECOMMENDATION_SCHEMA_FILE,
    RecordCodec,
    RejectedMessage,
    RejectReason,
)
from pipeline.stages.publish import (
    DETAIL_HEADER,
    REASON_HEADER,
    DeadLetterSink,
    RecommendationSink,
)
from pipeline.stages.score import ScoredBatch
from tests.pipeline.factories import prepared_batch, user_event
from tests.pipeline.fakes import FakeMessage, FakeProducer


@pytest.fixture
def codec() -> RecordCodec:
    return RecordCodec(CodecSettings(), RECOMMENDATION_SCHEMA_FILE, "recs")


def test_one_recommendation_per_event_guarding_the_batch_checkpoint(codec: RecordCodec) -> None:
    producer, metrics = FakeProducer(), Metrics()
    checkpoint = Checkpoint()
    batch = prepared_batch([user_event(3, user_id=5), user_event(2, user_id=6)], None, checkpoint)
    scored = ScoredBatch(
        counts=np.array([2, 1]),
        item_ids=np.array([102, 100, 101]),
        scores=np.array([0.9, 0.5, 0.7]),
    )
    latency = RecommendationSink(producer, "recs", codec, metrics).publish(batch, scored, "m-3")

    assert latency.shape == (2,)
    assert checkpoint.pending == 2
    records = producer.on_topic("recs")
    assert [r.key() for r in records] == [b"5", b"6"]
    decoded = [codec.decode(r.value() or b"") for r in records]
    assert [[i["item_id"] for i in d["items"]] for d in decoded] == [[102, 100], [101]]
    assert decoded[0]["model_version"] == "m-3"
    assert decoded[0]["fallback_features"] == ["user_features", "item_features"]
    producer.ack()
    assert checkpoint.pending == 0


def test_dead_letter_keeps_the_message_and_adds_reason_headers() -> None:
    producer, metrics = FakeProducer(), Metrics()
    message = FakeMessage("in", b"\x01garbage", 3, 17, _key=b"k", _headers=[("trace", b"t-1")])
    checkpoint = Checkpoint()
    rejection = RejectedMessage(RejectReason.UNDECODABLE, "x" * 5000)
    DeadLetterSink(producer, "dlq", metrics).publish(message, rejection, checkpoint)  # type: ignore[arg-type]

    (record,) = producer.on_topic("dlq")
    assert record.value() == b"\x01garbage" and record.key() == b"k"
    headers = dict(record.headers() or [])
    assert headers["trace"] == b"t-1"
    assert headers[REASON_HEADER] == b"undecodable"
    assert len(headers[DETAIL_HEADER] or b"") == 1024
    assert headers["x-source-partition"] == b"3" and headers["x-source-offset"] == b"17"
    assert checkpoint.pending == 1
    assert metrics.dead_lettered.labels(reason="undecodable")._value.get() == 1
