"""Candidate retrieval: a Faiss inner-product index over the served model's item vectors.

An event without candidates is answered from the item catalogue: the ``num_candidates`` items
whose ranker item embeddings have the largest inner product with the event's query vector,
which the ranker then scores like any other candidates.

What is indexed: one vector per catalogue item (a raw item id), the row of the ranker's
``item_id`` table that the id hashes to (:meth:`model.features.spec.FeatureSpec.hash_ids`). Faiss
ids are positions in the catalogue, so results map back to raw item ids; items that share a table
row (hash collisions) share a vector. The catalogue (which raw ids exist) is not in the model:
the caller passes it (:mod:`pipeline.models.catalogue` reads it from Redis or a file).

The query: the sum of the event-side embeddings in ``query_features`` (default the user's
``user_id`` row). DLRM's interaction layer takes the dot product of every pair of pooled
embeddings, so ``<user, item>``, ``<recent_items, item>``, ``<device, item>`` and
``<country, item>`` are each a feature of the ranker, and the inner product with their sum is
their unweighted total. That is a heuristic: the over-arch weighs those dot products with
learned weights (of either sign) and DLRM's embeddings are not trained for dot-product
retrieval, so the retrieved set is not the ranker's top of the catalogue. The dense features
are left out: the bottom MLP mixes the user's and the item's dense vectors, so there is no
user-only dense vector to add. Only ids the event itself carries are used (its own
``recent_item_ids``, not the Redis-stored ones), so retrieval can run right after decoding.

Index kinds (``index``): ``flat`` is exact (``IndexFlatIP``: every item scored per query);
``ivfpq`` is approximate (``IndexIVFPQ`` with inner product: ``nlist`` k-means cells, ``nprobe``
scanned per query, vectors PQ-coded in ``pq_m`` bytes), wrapped in ``IndexRefineFlat`` so that
the ``refine_factor * k`` best PQ hits are re-ranked with the exact vectors; ``auto`` picks
``flat`` up to ``exact_max_items`` items. Recall is measured against exact inner-product
search over the same vectors (``streamrank bench retrieval``).

:class:`VectorIndex` is the Faiss part alone (:func:`index_vectors` builds it from any vectors);
a configured model's index is one (``pipeline.models.configured_index``), its vectors and query
named by its configuration (:mod:`model.retrieval.sources`).

Threads: Faiss parallelises with OpenMP, and when torch is imported first (as in the pipeline)
Faiss's OpenMP calls resolve to torch's ``libgomp`` (torch loads it into the global symbol
scope), so ``faiss.omp_set_num_threads`` would also set the thread count of torch's next forward
on that thread. OpenMP's thread count is a per-thread setting, so :func:`faiss_threads` sets
``config.threads`` on the calling thread for the duration of one build or search and restores
it after: Faiss's thread count never changes torch's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import faiss
import numpy as np
import numpy.typing as npt

from model.features.spec import SparseFeature
from model.retrieval.config import QUERY_FEATURES, IndexKind, RetrievalConfig
from model.store.tables import EmbeddingTables

__all__ = [
    "QUERY_FEATURES",
    "IndexKind",
    "RetrievalConfig",
    "RetrievalIndex",
    "VectorIndex",
    "build_index",
    "faiss_threads",
    "index_vectors",
]

Int64Array = npt.NDArray[np.int64]
Float32Array = npt.NDArray[np.float32]


class QueryColumns(Protocol):
    """The columns :meth:`RetrievalIndex.queries` reads (``EventColumns`` has them all).

    Attributes:
        user_ids: int64[E] raw user ids.
        device_ids / country_ids: int64[E] ``model.features.spec.string_to_id`` of the strings.
        recent_counts: int64[E] recent items per event.
        recent_ids: int64[sum(recent_counts)] raw ids, event-major.
    """

    user_ids: Int64Array
    device_ids: Int64Array
    country_ids: Int64Array
    recent_counts: Int64Array
    recent_ids: Int64Array


@dataclass(frozen=True)
class VectorIndex:
    """A built Faiss index over catalogue item vectors, and how to search it.

    The part every retrieval shares: the built-in model's (:class:`RetrievalIndex`, which also
    computes its queries from the model's tables) and a configured model's (whose query
    vectors come from one of its tables or the user's Redis record: see
    :mod:`pipeline.models.configured_index`).

    Attributes:
        index: the Faiss index (ids are catalogue positions).
        kind: ``flat`` or ``ivfpq`` (what ``auto`` chose).
        item_ids: int64[N] the catalogue: raw item id of each Faiss id.
        config: the settings it was built with.
        build_seconds: wall time of the build (gathering vectors, training, adding).
        model_version: the model version whose vectors are indexed.
        scale: items and queries are multiplied by it before Faiss sees them (order is
            unchanged): untrained DLRM tables hold values around 1e-3, where Faiss's PQ
            training loses most of its precision; scores are divided back.

    Example::

        ids, scores = index.search(queries, 100)
    """

    index: Any
    kind: IndexKind
    item_ids: Int64Array
    config: RetrievalConfig
    build_seconds: float
    model_version: str
    scale: float = 1.0

    @property
    def num_items(self) -> int:
        """Catalogue items indexed."""
        return int(self.item_ids.shape[0])

    @property
    def dim(self) -> int:
        """The width of the indexed vectors (and of a query)."""
        return int(self.index.d)

    def search(self, queries: Float32Array, k: int) -> tuple[Int64Array, Float32Array]:
        """The ``k`` items with the largest inner product with each query.

        Args:
            queries: float32[E, dim].
            k: results per query.

        Returns:
            ``(raw item ids int64[E, k], inner products float32[E, k])``, best first; where
            fewer than ``k`` items are found (a small catalogue), ids are -1.
        """
        if queries.shape[0] == 0:
            return np.empty((0, k), np.int64), np.empty((0, k), np.float32)
        scaled = np.ascontiguousarray(queries * np.float32(self.scale), np.float32)
        with faiss_threads(self.config.threads):
            scores, positions = self.index.search(scaled, k)
        found = positions >= 0
        ids = np.where(found, self.item_ids[np.where(found, positions, 0)], -1)
        return ids.astype(np.int64), (scores / np.float32(self.scale**2)).astype(np.float32)


@dataclass(frozen=True)
class RetrievalIndex(VectorIndex):
    """The built-in model's index: its item vectors, and the tables its queries sum.

    Attributes:
        tables: the query-side tables (and the item table).

    Example::

        ids, scores = index.search(index.queries(events), 100)
    """

    tables: EmbeddingTables = field(kw_only=True)

    def queries(self, events: QueryColumns) -> Float32Array:
        """The query vector of each event (the sum of its ``query_features`` embeddings).

        Args:
            events: ``user_ids``, ``device_ids``, ``country_ids`` (int64[E]) and the event's
                own ``recent_counts`` / ``recent_ids`` (an ``EventColumns`` fits).

        Returns:
            float32[E, dim].
        """
        num = int(events.user_ids.shape[0])
        out = np.zeros((num, self.tables.dim), dtype=np.float32)
        for feature in self.config.query_features:
            if feature is SparseFeature.RECENT_ITEMS:
                if events.recent_ids.size:
                    owner = np.repeat(np.arange(num), events.recent_counts)
                    vectors = self.tables.rows(feature, events.recent_ids)
                    np.add.at(out, owner, vectors)
                continue
            raw = {
                SparseFeature.USER_ID: events.user_ids,
                SparseFeature.DEVICE: events.device_ids,
                SparseFeature.COUNTRY: events.country_ids,
            }[feature]
            out += self.tables.rows(feature, raw)
        return out


def build_index(
    tables: EmbeddingTables, item_ids: Int64Array, config: RetrievalConfig
) -> RetrievalIndex:
    """Index the catalogue's item vectors for inner-product search.

    Args:
        tables: the model's tables; must hold ``item_id`` and every ``query_features`` table
            (:meth:`EmbeddingTables.from_checkpoint` with :func:`needed_tables`).
        item_ids: int64[N] raw ids of the catalogue (duplicates are dropped).
        config: index kind and parameters.

    Returns:
        The index (its ``build_seconds`` measured here).

    Raises:
        ValueError: on an empty catalogue or a table that is missing.

    Example::

        tables = EmbeddingTables.from_checkpoint(path, needed_tables(config))
        index = build_index(tables, catalogue, config)
    """
    start = time.perf_counter()
    missing = set(needed_tables(config)) - set(tables.tables)
    if missing:
        raise ValueError(f"tables missing for retrieval: {sorted(f.value for f in missing)}")
    catalogue = np.unique(np.asarray(item_ids, dtype=np.int64))
    if catalogue.size == 0:
        raise ValueError("the item catalogue is empty: nothing to retrieve from")
    built = index_vectors(tables.rows(SparseFeature.ITEM_ID, catalogue), catalogue, config)
    return RetrievalIndex(
        index=built.index,
        kind=built.kind,
        item_ids=catalogue,
        config=config,
        build_seconds=time.perf_counter() - start,
        model_version=tables.model_version,
        scale=built.scale,
        tables=tables,
    )


def index_vectors(
    vectors: Float32Array, item_ids: Int64Array, config: RetrievalConfig, model_version: str = ""
) -> VectorIndex:
    """Index ``vectors`` (row ``i`` is item ``item_ids[i]``) for inner-product search.

    Args:
        vectors: float32[N, dim] one vector per item (changed in place: scaled).
        item_ids: int64[N] the raw item id of each vector (unique).
        config: index kind and parameters.
        model_version: recorded on the index.

    Returns:
        The index (its ``build_seconds`` measured here).

    Raises:
        ValueError: on no vectors.

    Example::

        index = index_vectors(item_table[rows], ids, RetrievalConfig(index=IndexKind.FLAT))
    """
    start = time.perf_counter()
    if vectors.shape[0] == 0:
        raise ValueError("the item catalogue is empty: nothing to retrieve from")
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    rms = float(np.sqrt(np.mean(np.square(vectors, dtype=np.float64))))
    scale = 1.0 / rms if rms > 0 else 1.0
    vectors *= np.float32(scale)
    dim = int(vectors.shape[1])
    kind = choose_kind(config, int(vectors.shape[0]))
    with faiss_threads(config.threads):
        index = _flat(dim, vectors) if kind is IndexKind.FLAT else _ivfpq(dim, vectors, config)
    seconds = time.perf_counter() - start
    ids = np.asarray(item_ids, dtype=np.int64)
    return VectorIndex(index, kind, ids, config, seconds, model_version, scale)


@contextmanager
def faiss_threads(threads: int) -> Iterator[None]:
    """Faiss's OpenMP threads on this thread for the ``with`` block, restored after.

    OpenMP's thread count is per thread and shared with torch's when both use one ``libgomp``
    (module docstring): setting it only around Faiss's own calls keeps torch's forward on the
    threads it was given.

    Args:
        threads: OpenMP threads for Faiss's calls; 0 leaves the current setting alone.

    Example::

        with faiss_threads(1):
            index.search(queries, k)
    """
    if not threads:
        yield
        return
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def needed_tables(config: RetrievalConfig) -> tuple[SparseFeature, ...]:
    """The tables an index of ``config`` reads: ``item_id`` and the query features'."""
    return (SparseFeature.ITEM_ID, *config.query_features)


def choose_kind(config: RetrievalConfig, num_items: int) -> IndexKind:
    """``config.index``, with ``auto`` resolved by catalogue size."""
    if config.index is not IndexKind.AUTO:
        return config.index
    return IndexKind.FLAT if num_items <= config.exact_max_items else IndexKind.IVFPQ


def ivf_parameters(config: RetrievalConfig, num_items: int, dim: int) -> tuple[int, int, int]:
    """``(nlist, pq_m, train_size)`` for ``num_items`` vectors of width ``dim``.

    Raises:
        ValueError: if ``pq_m`` does not divide ``dim``.
    """
    nlist = config.nlist or 2 ** round(math.log2(max(1.0, math.sqrt(num_items))))
    nlist = max(1, min(nlist, num_items // 39 or 1))
    pq_m = config.pq_m or max(1, dim // 4)
    if dim % pq_m:
        raise ValueError(f"pq_m={pq_m} must divide the embedding width {dim}")
    train = config.train_size or min(num_items, max(64 * nlist, 65_536))
    return nlist, pq_m, min(train, num_items)


def _flat(dim: int, vectors: Float32Array) -> Any:
    index = faiss.IndexFlatIP(dim)
    index.add(vectors)
    return index


def _ivfpq(dim: int, vectors: Float32Array, config: RetrievalConfig) -> Any:
    nlist, pq_m, train_size = ivf_parameters(config, vectors.shape[0], dim)
    quantizer = faiss.IndexFlatIP(dim)
    ivf = faiss.IndexIVFPQ(quantizer, dim, nlist, pq_m, config.pq_bits, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = config.seed
    ivf.nprobe = min(config.nprobe, nlist)
    rng = np.random.default_rng(config.seed)
    sample = vectors[np.sort(rng.choice(vectors.shape[0], train_size, replace=False))]
    index: Any = ivf
    if config.refine_factor > 1:
        index = faiss.IndexRefineFlat(ivf)
        index.k_factor = float(config.refine_factor)
    index.train(sample)  # Faiss's Python constructors keep ivf and quantizer referenced
    index.add(vectors)
    return index
