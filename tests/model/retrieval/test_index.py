"""The retrieval index: exact search is exact, IVFPQ finds what exact search finds, queries
sum the configured embeddings, results map back to raw item ids."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pytest

from model.features.spec import FeatureSpec, SparseFeature
from model.ranker import build_ranker
from model.retrieval.index import (
    IndexKind,
    RetrievalConfig,
    build_index,
    choose_kind,
    ivf_parameters,
    needed_tables,
)
from model.store.tables import EmbeddingTables

ALL_QUERY = (
    SparseFeature.USER_ID,
    SparseFeature.RECENT_ITEMS,
    SparseFeature.DEVICE,
    SparseFeature.COUNTRY,
)


@dataclass
class Events:
    user_ids: npt.NDArray[np.int64]
    device_ids: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    country_ids: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    recent_counts: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    recent_ids: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        n = self.user_ids.shape[0]
        for name in ("device_ids", "country_ids", "recent_counts"):
            if getattr(self, name).shape[0] != n:
                setattr(self, name, np.zeros(n, np.int64))


@pytest.fixture(scope="module")
def tables(spec: FeatureSpec) -> EmbeddingTables:
    ranker = build_ranker(spec, seed=3)
    return EmbeddingTables.from_ranker(ranker, (SparseFeature.ITEM_ID, *ALL_QUERY), "m3")


def distinct_row_items(spec: FeatureSpec, count: int) -> npt.NDArray[np.int64]:
    """Raw ids that hash to distinct item rows (no ties between items)."""
    raw = 10**12 + np.arange(4 * count, dtype=np.int64) * 104_729
    _, first = np.unique(spec.hash_ids(SparseFeature.ITEM_ID, raw), return_index=True)
    picked = raw[np.sort(first)][:count]
    assert picked.shape[0] == count
    return picked


def exact_top(
    tables: EmbeddingTables, items: npt.NDArray[np.int64], queries: npt.NDArray[np.float32], k: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    vectors = tables.rows(SparseFeature.ITEM_ID, items).astype(np.float64)
    scores = queries.astype(np.float64) @ vectors.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return items[order], np.take_along_axis(scores, order, axis=1)


def test_flat_index_is_exact_and_maps_back_to_raw_ids(
    tables: EmbeddingTables, spec: FeatureSpec
) -> None:
    items = distinct_row_items(spec, 3000)
    index = build_index(tables, items, RetrievalConfig(index=IndexKind.FLAT))
    assert (index.kind, index.num_items, index.model_version) == (IndexKind.FLAT, 3000, "m3")
    queries = index.queries(Events(user_ids=np.arange(50, dtype=np.int64)))
    ids, scores = index.search(queries, 20)
    want_ids, want_scores = exact_top(tables, items, queries, 20)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-9)


def test_ivfpq_recall_against_exact_search(tables: EmbeddingTables, spec: FeatureSpec) -> None:
    items = distinct_row_items(spec, 6000)
    config = RetrievalConfig(index=IndexKind.AUTO, exact_max_items=1000)
    index = build_index(tables, items, config)
    assert index.kind is IndexKind.IVFPQ
    queries = index.queries(Events(user_ids=np.arange(200, dtype=np.int64)))
    ids, _ = index.search(queries, 100)
    want, _ = exact_top(tables, items, queries, 100)
    recall = np.mean([len(set(a) & set(b)) / 100 for a, b in zip(ids, want, strict=True)])
    assert recall >= 0.9, recall
    no_refine = build_index(tables, items, RetrievalConfig(index=IndexKind.IVFPQ, nprobe=1))
    worse, _ = no_refine.search(queries, 100)
    recall_1 = np.mean([len(set(a) & set(b)) / 100 for a, b in zip(worse, want, strict=True)])
    assert recall_1 < recall  # the knobs matter: one cell scanned finds less


def test_query_sums_the_configured_embeddings(tables: EmbeddingTables, spec: FeatureSpec) -> None:
    items = distinct_row_items(spec, 100)
    index = build_index(tables, items, RetrievalConfig(query_features=ALL_QUERY))
    events = Events(
        user_ids=np.array([7, 8], np.int64),
        device_ids=np.array([11, 12], np.int64),
        country_ids=np.array([21, 22], np.int64),
        recent_counts=np.array([2, 0], np.int64),
        recent_ids=np.array([100, 200], np.int64),
    )
    got = index.queries(events)

    def row(feature: SparseFeature, raw: int) -> npt.NDArray[np.float32]:
        return tables.rows(feature, np.array([raw], np.int64))[0]

    first = (
        row(SparseFeature.USER_ID, 7)
        + row(SparseFeature.DEVICE, 11)
        + row(SparseFeature.COUNTRY, 21)
        + row(SparseFeature.RECENT_ITEMS, 100)
        + row(SparseFeature.RECENT_ITEMS, 200)
    )
    second = row(SparseFeature.USER_ID, 8) + row(SparseFeature.DEVICE, 12)
    second = second + row(SparseFeature.COUNTRY, 22)
    np.testing.assert_allclose(got, np.stack([first, second]), rtol=1e-5, atol=1e-7)


def test_a_catalogue_smaller_than_k_pads_with_minus_one(
    tables: EmbeddingTables, spec: FeatureSpec
) -> None:
    items = distinct_row_items(spec, 5)
    index = build_index(tables, np.concatenate([items, items]), RetrievalConfig())
    assert index.num_items == 5  # duplicates dropped
    ids, _ = index.search(index.queries(Events(user_ids=np.array([1], np.int64))), 8)
    assert sorted(ids[0, :5].tolist()) == sorted(items.tolist())
    assert ids[0, 5:].tolist() == [-1, -1, -1]
    empty_ids, _ = index.search(np.zeros((0, 16), np.float32), 8)
    assert empty_ids.shape == (0, 8)


def test_build_errors(tables: EmbeddingTables, spec: FeatureSpec) -> None:
    with pytest.raises(ValueError, match="empty"):
        build_index(tables, np.zeros(0, np.int64), RetrievalConfig())
    item_only = EmbeddingTables(
        spec, "m", {SparseFeature.ITEM_ID: tables.tables[SparseFeature.ITEM_ID]}
    )
    with pytest.raises(ValueError, match="user_id"):
        build_index(item_only, np.arange(10, dtype=np.int64), RetrievalConfig())
    with pytest.raises(ValueError, match="pq_m"):
        ivf_parameters(RetrievalConfig(pq_m=5), 10_000, 16)


def test_config_and_sizing_rules() -> None:
    assert needed_tables(RetrievalConfig()) == (SparseFeature.ITEM_ID, SparseFeature.USER_ID)
    auto = RetrievalConfig(exact_max_items=100)
    assert choose_kind(auto, 100) is IndexKind.FLAT
    assert choose_kind(auto, 101) is IndexKind.IVFPQ
    assert choose_kind(RetrievalConfig(index=IndexKind.FLAT), 10**7) is IndexKind.FLAT
    assert ivf_parameters(RetrievalConfig(), 1_000_000, 64) == (1024, 16, 65_536)
    assert ivf_parameters(RetrievalConfig(), 500, 64)[0] == 12  # >= 39 points per cell
    assert ivf_parameters(RetrievalConfig(nlist=7, train_size=300), 500, 64) == (7, 16, 300)
    for bad in ({"num_candidates": 0}, {"nprobe": 0}, {"refine_factor": -1}):
        with pytest.raises(ValueError):
            RetrievalConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="query_features"):
        RetrievalConfig(query_features=(SparseFeature.ITEM_ID,))


@pytest.mark.parametrize("kind", [IndexKind.FLAT, IndexKind.IVFPQ])
def test_faiss_threads_never_change_torch_threads(
    tables: EmbeddingTables, spec: FeatureSpec, kind: IndexKind
) -> None:
    # torch is imported before faiss here, as in the pipeline: both share torch's libgomp, whose
    # thread count is per thread. A build or search with threads=1 must leave this thread's
    # torch thread count as it was (3, whatever the machine's cores).
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        items = distinct_row_items(spec, 2000)
        index = build_index(tables, items, RetrievalConfig(index=kind, threads=1))
        assert torch.get_num_threads() == 3
        index.search(index.queries(Events(user_ids=np.arange(5, dtype=np.int64))), 10)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
