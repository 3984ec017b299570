"""Events without candidates get the index's best items; the others keep theirs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest

from model.features.spec import FeatureSpec, SparseFeature
from model.ranker import build_ranker
from model.retrieval.candidates import fill_candidates
from model.retrieval.index import RetrievalConfig, RetrievalIndex, build_index
from model.store.tables import EmbeddingTables

I64 = np.int64


@dataclass
class Batch:
    user_ids: npt.NDArray[np.int64]
    device_ids: npt.NDArray[np.int64]
    country_ids: npt.NDArray[np.int64]
    recent_counts: npt.NDArray[np.int64]
    recent_ids: npt.NDArray[np.int64]
    candidate_counts: npt.NDArray[np.int64]
    candidate_ids: npt.NDArray[np.int64]


def _index(spec: FeatureSpec, items: int, **config: object) -> RetrievalIndex:
    features = (SparseFeature.ITEM_ID, SparseFeature.USER_ID, SparseFeature.RECENT_ITEMS)
    tables = EmbeddingTables.from_ranker(build_ranker(spec, seed=4), features, "m4")
    catalogue = 7 + np.arange(items, dtype=I64) * 1_000_003
    return build_index(tables, catalogue, RetrievalConfig(**config))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def index(spec: FeatureSpec) -> RetrievalIndex:
    return _index(
        spec,
        500,
        num_candidates=10,
        query_features=(SparseFeature.USER_ID, SparseFeature.RECENT_ITEMS),
    )


def _batch() -> Batch:
    # Events 0 and 2 bring candidates; 1 and 3 ask for retrieval (3 with recent items).
    return Batch(
        user_ids=np.array([11, 12, 13, 14], I64),
        device_ids=np.zeros(4, I64),
        country_ids=np.zeros(4, I64),
        recent_counts=np.array([1, 0, 2, 3], I64),
        recent_ids=np.array([1, 2, 3, 4, 5, 6], I64),
        candidate_counts=np.array([2, 0, 3, 0], I64),
        candidate_ids=np.array([100, 101, 200, 201, 202], I64),
    )


def test_only_events_without_candidates_are_filled(index: RetrievalIndex) -> None:
    batch = _batch()
    found = fill_candidates(batch, index)
    assert found.candidate_counts.tolist() == [2, 10, 3, 10]
    assert found.retrieved.tolist() == [False, True, False, True]
    ids = found.candidate_ids
    assert ids[:2].tolist() == [100, 101]
    assert ids[12:15].tolist() == [200, 201, 202]
    alone = Batch(
        user_ids=np.array([12, 14], I64),
        device_ids=np.zeros(2, I64),
        country_ids=np.zeros(2, I64),
        recent_counts=np.array([0, 3], I64),
        recent_ids=np.array([4, 5, 6], I64),
        candidate_counts=np.zeros(2, I64),
        candidate_ids=np.zeros(0, I64),
    )
    want, _ = index.search(index.queries(alone), 10)
    assert ids[2:12].tolist() == want[0].tolist()
    assert ids[15:25].tolist() == want[1].tolist()
    assert set(ids[2:12].tolist()) <= set(index.item_ids.tolist())
    # The recent items of event 3 count in its query: it differs from a query without them.
    without, _ = index.search(index.tables.rows(SparseFeature.USER_ID, alone.user_ids), 10)
    assert without[1].tolist() != want[1].tolist()


def test_a_batch_with_candidates_everywhere_is_untouched(index: RetrievalIndex) -> None:
    batch = _batch()
    batch.candidate_counts = np.array([2, 1, 3, 1], I64)
    batch.candidate_ids = np.arange(7, dtype=I64)
    found = fill_candidates(batch, index)
    assert found.candidate_ids is batch.candidate_ids
    assert found.candidate_counts.tolist() == [2, 1, 3, 1]
    assert not found.retrieved.any()


def test_a_small_catalogue_gives_fewer_candidates(spec: FeatureSpec) -> None:
    small = _index(spec, 4, num_candidates=10)
    found = fill_candidates(_batch(), small)
    assert found.candidate_counts.tolist() == [2, 4, 3, 4]
    assert len(found.candidate_ids) == 13
    assert (found.candidate_ids >= 0).all()


def test_k_overrides_the_configured_count(index: RetrievalIndex) -> None:
    found = fill_candidates(_batch(), index, k=3)
    assert found.candidate_counts.tolist() == [2, 3, 3, 3]
