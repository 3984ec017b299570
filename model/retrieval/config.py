"""How the retrieval index is built and queried (no Faiss or torch import: configuration
loading uses it). See :mod:`model.retrieval.index`."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from model.features.spec import SparseFeature

__all__ = ["QUERY_FEATURES", "IndexKind", "RetrievalConfig"]

#: Event-side features a query may sum (each table is dotted with the item's in DLRM).
QUERY_FEATURES: tuple[SparseFeature, ...] = (
    SparseFeature.USER_ID,
    SparseFeature.RECENT_ITEMS,
    SparseFeature.DEVICE,
    SparseFeature.COUNTRY,
)


class IndexKind(enum.StrEnum):
    """Which Faiss index :func:`build_index` builds."""

    AUTO = "auto"
    """``flat`` up to ``exact_max_items`` catalogue items, else ``ivfpq``."""
    FLAT = "flat"
    """Exact inner-product search (``IndexFlatIP``)."""
    IVFPQ = "ivfpq"
    """Approximate: IVF cells, PQ codes, exact re-ranking of the best hits."""


@dataclass(frozen=True)
class RetrievalConfig:
    """How the retrieval index is built and queried.

    Attributes:
        num_candidates: items retrieved per event (then scored by the ranker).
        index: the index kind (:class:`IndexKind`).
        exact_max_items: with ``index = auto``, the largest catalogue indexed exactly.
        nlist: IVF cells; 0 picks ``sqrt(items)`` rounded to a power of two (at least 1, at
            most ``items / 39`` so k-means has enough points per cell).
        nprobe: IVF cells scanned per query (more: better recall, slower).
        pq_m: PQ sub-quantizers (bytes per vector with 8 bits); 0 picks ``dim / 4``. Must
            divide the embedding width.
        pq_bits: bits per PQ code.
        refine_factor: the ``refine_factor * k`` best PQ hits are re-ranked exactly; 0 or 1
            turns re-ranking off (the index then holds only the PQ codes).
        train_size: vectors k-means and PQ are trained on; 0 picks
            ``min(items, max(64 * nlist, 65536))``.
        query_features: event-side tables summed into the query vector (a subset of
            :data:`QUERY_FEATURES`).
        threads: OpenMP threads of Faiss's own calls (an index build, a search), set on the
            calling thread for each call and restored after, so torch's thread count is never
            changed (:func:`model.retrieval.index.faiss_threads`); 0 uses the calling thread's
            current setting (torch's). 1 (default) keeps builds and searches to one core (on a
            2-core machine shared with other work, 2 threads trained a small index 7x slower
            than 1: OpenMP workers spin while they wait).
        seed: seed of the k-means/PQ training sample and of Faiss's clustering.

    Example::

        config = RetrievalConfig(num_candidates=100, index=IndexKind.AUTO, nprobe=32)
    """

    num_candidates: int = 100
    index: IndexKind = IndexKind.AUTO
    exact_max_items: int = 100_000
    nlist: int = 0
    nprobe: int = 64
    pq_m: int = 0
    pq_bits: int = 8
    refine_factor: int = 4
    train_size: int = 0
    query_features: tuple[SparseFeature, ...] = (SparseFeature.USER_ID,)
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        positive = ("num_candidates", "exact_max_items", "nprobe", "pq_bits")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("nlist", "pq_m", "refine_factor", "train_size", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if not self.query_features or not set(self.query_features) <= set(QUERY_FEATURES):
            raise ValueError(
                f"query_features must be a non-empty subset of {[f.value for f in QUERY_FEATURES]}"
            )
