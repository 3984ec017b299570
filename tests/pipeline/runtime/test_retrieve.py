"""Retrieval right after decoding: events without candidates get the index's best items and
the retrieved flag; without an index they are dead-lettered as no_candidates."""

from __future__ import annotations

import numpy as np
import pytest

from model.features.spec import SparseFeature
from model.ranker import build_ranker
from model.retrieval.candidates import fill_candidates
from model.retrieval.index import RetrievalConfig, RetrievalIndex, build_index
from model.store.tables import EmbeddingTables
from pipeline.observability.metrics import Metrics
from pipeline.runtime.retrieve import CandidateRetriever
from pipeline.settings.codec import CodecSettings
from pipeline.stages.decode import MessageDecoder
from pipeline.types import RejectReason
from tests.pipeline.factories import TINY_SPEC, encode_events, event_messages, user_event
from tests.pipeline.fakes import polled

CATALOGUE = np.arange(1_000, 1_060, dtype=np.int64)


@pytest.fixture(scope="module")
def index() -> RetrievalIndex:
    features = (SparseFeature.ITEM_ID, SparseFeature.USER_ID)
    tables = EmbeddingTables.from_ranker(build_ranker(TINY_SPEC, seed=1), features, "tiny-1")
    return build_index(tables, CATALOGUE, RetrievalConfig(num_candidates=6))


def _decoded(records: list[dict[str, object]]):  # type: ignore[no-untyped-def]
    decoder = MessageDecoder(CodecSettings(), TINY_SPEC.recent_items_cap, retrieve=True)
    return decoder.decode(polled(event_messages("in", encode_events(records))))


def test_events_without_candidates_get_the_index_best_items(index: RetrievalIndex) -> None:
    records = [user_event(candidates=3), user_event(candidates=0, user_id=11), user_event(2)]
    decoded = _decoded(records)
    metrics = Metrics()
    filled = CandidateRetriever(index, num_candidates=6, metrics=metrics).fill(decoded)
    events = filled.events
    assert events.candidate_counts.tolist() == [3, 6, 2]
    assert events.retrieved.tolist() == [False, True, False]
    expected = fill_candidates(decoded.events, index, 6)
    np.testing.assert_array_equal(events.candidate_ids, expected.candidate_ids)
    retrieved = events.candidate_ids[3:9]
    assert set(retrieved.tolist()) <= set(CATALOGUE.tolist())
    assert events.candidate_ids[:3].tolist() == records[0]["candidate_item_ids"]
    assert filled.rejections == [] and filled.event_message.tolist() == [0, 1, 2]
    assert metrics.retrieved_events._value.get() == 1


def test_without_an_index_they_are_dead_lettered_in_their_places() -> None:
    records = [user_event(candidates=0), user_event(candidates=2), user_event(candidates=0)]
    filled = CandidateRetriever(None, num_candidates=6).fill(_decoded(records))
    assert filled.event_message.tolist() == [1]
    assert filled.events.candidate_counts.tolist() == [2]
    assert [(i, r.reason) for i, r in filled.rejections] == [
        (0, RejectReason.NO_CANDIDATES),
        (2, RejectReason.NO_CANDIDATES),
    ]
    assert "no retrieval index" in filled.rejections[0][1].detail


def test_events_with_candidates_pass_untouched(index: RetrievalIndex) -> None:
    decoded = _decoded([user_event(candidates=4), user_event(candidates=1)])
    assert CandidateRetriever(index, num_candidates=6).fill(decoded) is decoded
