"""The publish stage's compiled Recommendation encoder against fastavro, on random batches (raw
and Confluent framing)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.connectors.avro.reference import (
    RECOMMENDATION_SCHEMA_FILE,
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
    records_to_columns,
)
from pipeline.observability.metrics import Metrics
from pipeline.settings.codec import CodecSettings
from pipeline.stages.decode import MessageDecoder
from pipeline.stages.publish import FallbackFlags, RecommendationSink, recommendation
from pipeline.types import ScoredBatch
from tests.pipeline.fakes import FakeProducer, sender
from tests.support.kernel_types import record_argument_types

longs = st.integers(-(2**63), 2**63 - 1)
scores = st.floats(allow_nan=False, width=64)
event = st.tuples(
    st.text(max_size=10),  # event id
    longs,  # user id
    st.lists(st.tuples(longs, scores), max_size=6),  # top-K (item id, score)
    st.booleans(),  # user features fell back
    st.booleans(),  # item features fell back
    st.booleans(),  # retrieved
)


def _columns(batch: list[Any]) -> Any:
    columns = records_to_columns(
        [
            {
                "event_id": eid,
                "user_id": uid,
                "event_time": 1_700_000_000_000,
                "context": {"device": "", "country": ""},
                "candidate_item_ids": [0],
                "recent_item_ids": [],
                "num_results": 1,
            }
            for eid, uid, *_ in batch
        ]
    )
    columns.retrieved = np.array([r for *_, r in batch], dtype=bool)
    return columns


def _check(codec: RecordCodec, batch: list[Any], model_version: str, now_ms: int) -> None:
    scored = ScoredBatch(
        counts=np.array([len(top) for _, _, top, *_ in batch], dtype=np.int64),
        item_ids=np.array([i for _, _, top, *_ in batch for i, _ in top], dtype=np.int64),
        scores=np.array([s for _, _, top, *_ in batch for _, s in top], dtype=np.float64),
        model_version=model_version,
    )
    flags = FallbackFlags(
        user=np.array([u for *_, u, _, _ in batch], dtype=bool),
        item=np.array([i for *_, i, _ in batch], dtype=bool),
    )
    sink = RecommendationSink(sender(FakeProducer()), "recs", codec.header, Metrics())
    got = sink.encode(_columns(batch), scored, flags, now_ms)
    want = [
        codec.encode(
            {
                "event_id": eid,
                "user_id": uid,
                "items": [{"item_id": i, "score": s} for i, s in top],
                "model_version": model_version,
                "scored_at": now_ms,
                "fallback_features": [
                    name
                    for name, on in (
                        ("user_features", flags.user[e]),
                        ("item_features", flags.item[e]),
                    )
                    if on
                ],
                "retrieved": retrieved,
            }
        )
        for e, (eid, uid, top, _, _, retrieved) in enumerate(batch)
    ]
    assert got == want


@settings(max_examples=300, deadline=None)
@given(st.lists(event, max_size=8), st.text(max_size=8), longs)
def test_encode_is_byte_identical_to_fastavro(
    batch: list[Any], model_version: str, now_ms: int
) -> None:
    _check(
        RecordCodec(CodecSettings(), RECOMMENDATION_SCHEMA_FILE, "recs"),
        batch,
        model_version,
        now_ms,
    )


# One registry for all examples is what we want: the schema is registered once.
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(event, min_size=1, max_size=4))
def test_confluent_records_carry_the_registered_header(
    confluent_settings: CodecSettings, batch: list[Any]
) -> None:
    codec = RecordCodec(confluent_settings, RECOMMENDATION_SCHEMA_FILE, "recs")
    assert len(codec.header) == 5
    _check(codec, batch, "m-1", 1_700_000_000_000)


def test_the_warm_up_loads_the_kernel_a_decoded_batch_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink's warm-up passes the encoder kernel arrays of the same numba types as a batch
    from the decoder; one of another type (a read-only array, say) is a specialization of its
    own, loaded or compiled when the first real batch comes."""
    calls = record_argument_types(monkeypatch, recommendation, "encode_recommendations")
    codec = RecordCodec(CodecSettings(), USER_EVENT_SCHEMA_FILE, "in")
    record = {
        "event_id": "e-1",
        "user_id": 7,
        "event_time": 1_700_000_000_000,
        "context": {"device": "ios", "country": "DE"},
        "candidate_item_ids": [3, 4],
        "recent_item_ids": None,
        "num_results": 1,
    }
    events, _, _ = MessageDecoder(CodecSettings(), 5).decode_values([codec.encode(record)])
    sink = RecommendationSink(sender(FakeProducer()), "recs", codec.header, Metrics())
    (warm_up,) = calls
    scored = ScoredBatch(np.array([1]), np.array([3]), np.array([0.5]), "m-1")
    flags = FallbackFlags(user=np.zeros(1, dtype=bool), item=np.zeros(1, dtype=bool))
    sink.encode(events, scored, flags, 1_700_000_000_000)
    assert calls[1] == warm_up
