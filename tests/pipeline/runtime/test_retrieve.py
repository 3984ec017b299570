"""Retrieval right after decoding: events without candidates get the index's best items and
the retrieved flag; without an index they are dead-lettered as no_candidates."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from model.features.mapping import (
    RecordField,
    RecordFormat,
    RecordKind,
    RecordLayout,
    Source,
    SparseKey,
    Store,
    Transform,
)
from model.features.spec import SparseFeature
from model.ranker import build_ranker
from model.retrieval.candidates import fill_candidates
from model.retrieval.index import RetrievalConfig, RetrievalIndex, build_index, index_vectors
from model.retrieval.sources import RecordVectors, RetrievalPlan, TableVectors, VectorSource
from model.store.tables import EmbeddingTables
from pipeline.models.configured_index import ConfiguredIndex
from pipeline.observability.metrics import Metrics
from pipeline.runtime.retrieve import CandidateRetriever
from pipeline.settings.codec import CodecSettings
from pipeline.stages.decode import MessageDecoder
from pipeline.types import FieldColumns, RejectReason
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


def _configured(query: TableVectors | RecordVectors, items: np.ndarray) -> ConfiguredIndex:
    """A configured index over ``items`` (row ``i``: item ``CATALOGUE[i]``)."""
    built = index_vectors(items.copy(), CATALOGUE, RetrievalConfig(num_candidates=5), "cfg-1")
    plan = RetrievalPlan(query, query, item_id_limit=1 << 40)
    table = QUERY_TABLE if isinstance(query, TableVectors) else None
    return ConfiguredIndex.of(built, plan, table)


RNG = np.random.default_rng(3)
QUERY_TABLE = RNG.standard_normal((10, 4)).astype(np.float32)
ITEMS = RNG.standard_normal((len(CATALOGUE), 4)).astype(np.float32)
USER_KEY = SparseKey("viewer", Source.EVENT, Store.INTS, 0, Transform.MODULO, 10)
TASTE = RecordField("taste", RecordKind.VECTOR, 4, 1)  # after a one-value field


def _best(query: np.ndarray, k: int = 5) -> list[int]:
    return CATALOGUE[np.argsort(-(ITEMS.astype(np.float64) @ query))[:k]].tolist()


def test_a_configured_index_queries_with_the_row_the_user_id_looks_up() -> None:
    table = TableVectors("t_viewer", "t_viewer.weight", 10, 4, USER_KEY)
    index = _configured(table, ITEMS)
    decoded = _decoded([user_event(candidates=0, user_id=13), user_event(candidates=2)])
    filled = CandidateRetriever(index, num_candidates=5).fill(decoded)
    assert filled.events.candidate_counts.tolist() == [5, 2]
    assert filled.events.retrieved.tolist() == [True, False]
    assert filled.events.candidate_ids[:5].tolist() == _best(QUERY_TABLE[13 % 10])


class _Users:
    """An enricher whose users' records hold ``taste`` (NaN: absent) after one other value."""

    def __init__(self, tastes: dict[int, np.ndarray]) -> None:
        self.tastes = tastes
        self.asked: list[list[int]] = []

    def enrich(self, user_ids: np.ndarray, item_ids: np.ndarray) -> SimpleNamespace:
        assert item_ids.size == 0
        self.asked.append(user_ids.tolist())
        floats = np.full((len(user_ids), 5), np.nan, dtype=np.float32)
        for row, user in enumerate(user_ids.tolist()):
            if user in self.tastes:
                floats[row, 1:] = self.tastes[user]
        fields = FieldColumns.empty(len(user_ids), floats=5)
        fields.floats = floats
        return SimpleNamespace(user_fields=fields)


def test_a_configured_index_queries_with_the_user_record_vector_through_the_enricher() -> None:
    layout = RecordLayout("viewer:{id}", RecordFormat.HASH, (TASTE,))
    index = _configured(RecordVectors(VectorSource.USER, layout, TASTE), ITEMS)
    taste = RNG.standard_normal(4).astype(np.float32)
    users = _Users({7: taste})
    records = [
        user_event(candidates=0, user_id=8),  # no taste: dead-lettered, named
        user_event(candidates=0, user_id=7),
        user_event(candidates=3),
    ]
    filled = CandidateRetriever(index, 5, Metrics(), users).fill(_decoded(records))  # type: ignore[arg-type]
    assert users.asked == [[8, 7]]  # one read for the events that ask
    assert filled.event_message.tolist() == [1, 2]
    assert filled.events.candidate_counts.tolist() == [5, 3]
    assert filled.events.candidate_ids[:5].tolist() == _best(taste)
    assert [(i, r.reason) for i, r in filled.rejections] == [(0, RejectReason.NO_CANDIDATES)]
    assert "the user has no query vector (features.user.fields.taste)" in (
        filled.rejections[0][1].detail
    )
