"""``streamrank bench retrieval``: the ANN index against exact inner-product search.

For a catalogue of ``items`` raw item ids and ``queries`` users, it builds the exact index
(``IndexFlatIP``) and the approximate one (IVFPQ with exact re-ranking, as ``[retrieval]``
configures it) over the same item vectors, and reports for each ``nprobe``:

- ``recall_at_k``: the share of the approximate top-k that belongs to the exact top-k. Items
  whose table rows collide share a vector, so ties are real: a result counts as found when its
  exact inner product reaches the exact k-th best (it could be swapped for a tied item);
- ``ms_per_event``: search time per query, queries searched ``batch`` at a time (as the
  pipeline searches the events of a micro-batch together), and the speed-up over exact search;
- ``build_s`` of each index (vectors gathered, k-means/PQ training, adding).

The vectors are the served model's item table (``model.checkpoint``; a versions directory's
current version) when it has at least ``items`` rows; a larger catalogue gets an untrained
model whose item table has ``items`` rows (random init: no cluster structure, the hard case
for IVF), so that items do not collapse onto shared rows. ``vectors`` in the result says which.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from model.features.spec import FeatureSpec, SparseFeature
from model.ranker import build_ranker
from model.retrieval.index import (
    IndexKind,
    RetrievalConfig,
    RetrievalIndex,
    build_index,
    choose_kind,
    ivf_parameters,
    needed_tables,
)
from model.store.tables import EmbeddingTables
from model.store.versions import NoCurrentVersionError, resolve_checkpoint
from model.synthetic import ITEM_ID_BASE, ITEM_ID_STRIDE, USER_ID_BASE, USER_ID_STRIDE
from pipeline.settings.loading import Settings

log = logging.getLogger(__name__)

Int64Array = npt.NDArray[np.int64]
Float32Array = npt.NDArray[np.float32]


@dataclass
class _Events:
    """Query columns of ``n`` users (no context, no recent items)."""

    user_ids: Int64Array
    device_ids: Int64Array
    country_ids: Int64Array
    recent_counts: Int64Array
    recent_ids: Int64Array


def bench_retrieval(
    settings: Settings,
    config: RetrievalConfig,
    items: int = 0,
    queries: int = 1000,
    batch: int = 64,
    k: int = 100,
    nprobes: tuple[int, ...] = (),
    seed: int = 0,
) -> dict[str, Any]:
    """Recall@k, time per event and build time of the approximate index vs exact search.

    Args:
        settings: ``model.checkpoint`` (else ``[model]``) gives the vectors.
        config: the index parameters (``[retrieval]``); ``index`` is ignored (both built).
        items: catalogue size; 0: as many as the model's item table has rows.
        queries: users queried.
        batch: queries per search call.
        k: results per query.
        nprobes: IVF cells scanned per query, one result row each; default ``config.nprobe``.
        seed: which users are queried.

    Returns:
        The figures (see the module docstring), JSON-ready.

    Example::

        result = bench_retrieval(settings, RetrievalConfig(), items=1_000_000)
    """
    tables, vectors = _tables(settings, config, items)
    num_items = items or tables.spec.table(SparseFeature.ITEM_ID).num_embeddings
    catalogue = ITEM_ID_BASE + np.arange(num_items, dtype=np.int64) * ITEM_ID_STRIDE
    rng = np.random.default_rng(seed)
    users = USER_ID_BASE + rng.integers(0, 10 * queries, queries).astype(np.int64) * USER_ID_STRIDE
    zeros = np.zeros(queries, np.int64)
    events = _Events(users, zeros, zeros, zeros, np.zeros(0, np.int64))

    exact = build_index(tables, catalogue, replace(config, index=IndexKind.FLAT))
    query_vectors = exact.queries(events)
    _, exact_ms = _search(exact, query_vectors, k, batch)
    _, exact_scores = exact.search(query_vectors, k)
    approx = build_index(tables, catalogue, replace(config, index=IndexKind.IVFPQ))
    nlist, pq_m, train_size = ivf_parameters(config, approx.num_items, tables.dim)
    rows = []
    for nprobe in nprobes or (config.nprobe,):
        _ivf(approx).nprobe = min(nprobe, nlist)
        found, ms = _search(approx, query_vectors, k, batch)
        recall = _tie_aware_recall(tables, query_vectors, found, exact_scores[:, -1])
        rows.append(
            {
                "nprobe": min(nprobe, nlist),
                "recall_at_k": round(recall, 4),
                "ms_per_event": round(ms, 4),
                "speedup_vs_exact": round(exact_ms / ms, 2) if ms > 0 else None,
            }
        )
    return {
        "items": approx.num_items,
        "item_rows": tables.spec.table(SparseFeature.ITEM_ID).num_embeddings,
        "dim": tables.dim,
        "vectors": vectors,
        "queries": queries,
        "batch": batch,
        "k": k,
        "query_features": [f.value for f in config.query_features],
        "threads": config.threads,
        "auto_chooses": choose_kind(config, approx.num_items).value,
        "exact": {"build_s": round(exact.build_seconds, 3), "ms_per_event": round(exact_ms, 4)},
        "ivfpq": {
            "build_s": round(approx.build_seconds, 3),
            "nlist": nlist,
            "pq_m": pq_m,
            "pq_bits": config.pq_bits,
            "refine_factor": config.refine_factor,
            "train_size": train_size,
            "by_nprobe": rows,
        },
    }


def _tables(settings: Settings, config: RetrievalConfig, items: int) -> tuple[EmbeddingTables, str]:
    """The tables to index, and a description of where they come from."""
    features = needed_tables(config)
    try:
        checkpoint = resolve_checkpoint(settings.model.checkpoint)
    except (FileNotFoundError, NoCurrentVersionError):
        checkpoint = None
    if checkpoint is not None:
        tables = EmbeddingTables.from_checkpoint(checkpoint, features)
        if items <= tables.spec.table(SparseFeature.ITEM_ID).num_embeddings:
            return tables, f"checkpoint {tables.model_version} ({checkpoint})"
        spec = tables.spec
    else:
        spec = settings.model.feature_spec()
        if items <= spec.table(SparseFeature.ITEM_ID).num_embeddings:
            log.warning("no checkpoint at %s: untrained vectors", settings.model.checkpoint)
            ranker = build_ranker(spec, seed=0)
            return EmbeddingTables.from_ranker(ranker, features, "untrained"), "untrained"
    bigger = _with_item_rows(spec, items)
    ranker = build_ranker(bigger, seed=0)
    described = f"untrained, item table resized to {items} rows (random init)"
    return EmbeddingTables.from_ranker(ranker, features, "untrained"), described


def _with_item_rows(spec: FeatureSpec, rows: int) -> FeatureSpec:
    tables = tuple(
        replace(t, num_embeddings=rows) if t.feature is SparseFeature.ITEM_ID else t
        for t in spec.tables
    )
    return replace(spec, tables=tables)


def _ivf(index: RetrievalIndex) -> Any:
    import faiss

    return faiss.extract_index_ivf(index.index)


def _search(
    index: RetrievalIndex, queries: Float32Array, k: int, batch: int
) -> tuple[Int64Array, float]:
    """All queries, ``batch`` at a time: the ids and the milliseconds per query."""
    index.search(queries[:batch], k)  # warm-up (first touch of the index's memory)
    parts = []
    start = time.perf_counter()
    for lo in range(0, queries.shape[0], batch):
        parts.append(index.search(queries[lo : lo + batch], k)[0])
    seconds = time.perf_counter() - start
    return np.concatenate(parts), 1000.0 * seconds / max(1, queries.shape[0])


def _tie_aware_recall(
    tables: EmbeddingTables, queries: Float32Array, found: Int64Array, kth_exact: Float32Array
) -> float:
    """Share of ``found`` whose exact inner product reaches the exact k-th best score."""
    valid = found >= 0
    vectors = tables.rows(SparseFeature.ITEM_ID, np.where(valid, found, 0).reshape(-1))
    scores = np.einsum("qkd,qd->qk", vectors.reshape(*found.shape, -1), queries)
    tolerance = 1e-5 * np.maximum(np.abs(kth_exact), 1e-12)
    hits = valid & (scores >= (kth_exact - tolerance)[:, None])
    return float(hits.sum() / found.size)
