"""The publish stage against a fake producer: records, keys, headers, acknowledgements."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.connectors.avro.reference import RECOMMENDATION_SCHEMA_FILE, RecordCodec
from pipeline.observability.metrics import Metrics
from pipeline.settings.codec import CodecSettings
from pipeline.stages.publish import RecommendationSink, fallback_flags
from pipeline.types import Checkpoint, ScoredBatch
from tests.pipeline.factories import prepared_batch, user_event
from tests.pipeline.fakes import FakeProducer, sender
from tests.pipeline.stages.test_features import EventFactory, _enrichment, _events


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
        model_version="m-3",
    )
    latency = RecommendationSink(sender(producer), "recs", codec.header, metrics).publish(
        batch, scored
    )

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


def test_a_failing_encode_sends_nothing(codec: RecordCodec) -> None:
    producer = FakeProducer()
    batch = prepared_batch([user_event(3), user_event(2)])
    scored = ScoredBatch(  # counts that do not match the items: the encoder cannot run
        counts=np.array([2, 5]),
        item_ids=np.array([102, 100, 101]),
        scores=np.array([0.9, 0.5, 0.7]),
        model_version="m-3",
    )
    sink = RecommendationSink(sender(producer), "recs", codec.header, Metrics())
    with pytest.raises(Exception):  # noqa: B017 - whatever the encoder raises
        sink.encode_batch(batch, scored)
    assert producer.on_topic("recs") == [] and batch.batch.checkpoint.pending == 0


# ---------------------------------------------------------------------------- fallback_flags --


def test_item_flag_set_when_any_candidate_missing(make_event: EventFactory) -> None:
    events = _events(make_event, [[1, 2], [3], [4, 5, 6], [7]])
    enrichment = _enrichment(
        4,
        7,
        user_missing=[False, True, False, True],
        item_missing=[False, True, False, False, False, True, False],
    )
    flags = fallback_flags(events, enrichment)
    assert flags.item.tolist() == [True, False, True, False]
    assert flags.user.tolist() == [False, True, False, True]
    assert flags.item.dtype == np.bool_


def test_item_flag_first_and_last_rows(make_event: EventFactory) -> None:
    events = _events(make_event, [[1, 2, 3], [4, 5]])
    first = fallback_flags(events, _enrichment(2, 5, item_missing=[True] + [False] * 4))
    assert first.item.tolist() == [True, False]
    last = fallback_flags(events, _enrichment(2, 5, item_missing=[False] * 4 + [True]))
    assert last.item.tolist() == [False, True]


def test_no_fallback(make_event: EventFactory) -> None:
    events = _events(make_event, [[1], [2, 3]])
    flags = fallback_flags(events, _enrichment(2, 3))
    assert not flags.user.any()
    assert not flags.item.any()


def test_single_event(make_event: EventFactory) -> None:
    events = _events(make_event, [[1, 2, 3]])
    flags = fallback_flags(events, _enrichment(1, 3, item_missing=[False, False, True]))
    assert flags.item.tolist() == [True]


def test_user_flags_are_a_copy(make_event: EventFactory) -> None:
    events = _events(make_event, [[1], [2]])
    enrichment = _enrichment(2, 2, user_missing=[True, False])
    flags = fallback_flags(events, enrichment)
    flags.user[:] = False
    assert enrichment.user_missing.tolist() == [True, False]


def test_flags_match_a_per_event_loop(make_event: EventFactory) -> None:
    rng = np.random.default_rng(11)
    counts = rng.integers(1, 6, 40).tolist()
    events = _events(make_event, [list(range(c)) for c in counts])
    missing = (rng.random(sum(counts)) < 0.1).tolist()
    flags = fallback_flags(events, _enrichment(40, sum(counts), item_missing=missing))
    starts = np.concatenate(([0], np.cumsum(counts)))
    expected = [any(missing[starts[e] : starts[e + 1]]) for e in range(40)]
    assert flags.item.tolist() == expected
