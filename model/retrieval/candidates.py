"""Give the events of a batch that came without candidates retrieved ones (vectorised).

An event whose ``candidate_item_ids`` is empty asks "what should this user see?": its
candidates are the ``num_candidates`` best items of the retrieval index
(:mod:`model.retrieval.index`), and the ranker scores them like any other candidates. Events with
candidates are left exactly as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from model.features.segments import take_segments
from model.retrieval.index import RetrievalIndex, VectorIndex

__all__ = ["CandidateColumns", "RetrievedCandidates", "fill_candidates", "search_candidates"]

Int64Array = npt.NDArray[np.int64]


class CandidateColumns(Protocol):
    """The event columns :func:`fill_candidates` reads (``EventColumns`` has them all).

    Attributes:
        user_ids / device_ids / country_ids: int64[E] (the query, see
            :meth:`model.retrieval.index.RetrievalIndex.queries`).
        recent_counts / recent_ids: the events' own recent items (jagged).
        candidate_counts: int64[E]; 0 marks an event that asks for retrieval.
        candidate_ids: int64[sum(candidate_counts)] event-major.
    """

    user_ids: Int64Array
    device_ids: Int64Array
    country_ids: Int64Array
    recent_counts: Int64Array
    recent_ids: Int64Array
    candidate_counts: Int64Array
    candidate_ids: Int64Array


@dataclass
class _Subset:
    """Some events' query columns (a :class:`model.retrieval.index.QueryColumns`)."""

    user_ids: Int64Array
    device_ids: Int64Array
    country_ids: Int64Array
    recent_counts: Int64Array
    recent_ids: Int64Array


@dataclass(frozen=True)
class RetrievedCandidates:
    """The batch's candidates after retrieval.

    Attributes:
        candidate_counts: int64[E]; still 0 for an event the index found nothing for (an
            empty catalogue), which the caller rejects as before (``no_candidates``).
        candidate_ids: int64[sum(candidate_counts)] event-major; a retrieved event's ids are
            best first by inner product.
        retrieved: bool[E] whether an event's candidates came from the index (the
            Recommendation's ``retrieved`` field).
    """

    candidate_counts: Int64Array
    candidate_ids: Int64Array
    retrieved: npt.NDArray[np.bool_]


def fill_candidates(
    events: CandidateColumns, index: RetrievalIndex, k: int | None = None
) -> RetrievedCandidates:
    """Retrieve candidates for the events that have none; keep the others' as they are.

    One batched index search for all of them (no per-event Python).

    Args:
        events: the batch (``EventColumns`` fits).
        index: the served model's retrieval index.
        k: candidates per retrieved event; default ``index.config.num_candidates``.

    Returns:
        The new candidate columns and the ``retrieved`` flags.

    Example::

        found = fill_candidates(events, index)
        events = dataclasses.replace(events, candidate_counts=found.candidate_counts,
                                     candidate_ids=found.candidate_ids)
    """
    counts = np.asarray(events.candidate_counts, dtype=np.int64)
    wanted = counts == 0
    if not wanted.any():
        return RetrievedCandidates(counts, events.candidate_ids, wanted)
    which = np.flatnonzero(wanted)
    recent = take_segments(events.recent_counts, which)
    subset = _Subset(
        user_ids=events.user_ids[which],
        device_ids=events.device_ids[which],
        country_ids=events.country_ids[which],
        recent_counts=np.asarray(events.recent_counts, dtype=np.int64)[which],
        recent_ids=events.recent_ids[recent],
    )
    queries = index.queries(subset)
    return search_candidates(counts, events.candidate_ids, which, queries, index, k)


def search_candidates(
    counts: Int64Array,
    candidate_ids: Int64Array,
    which: Int64Array,
    queries: npt.NDArray[np.float32],
    index: VectorIndex,
    k: int | None = None,
) -> RetrievedCandidates:
    """Give the events ``which`` the best items of ``index`` for their ``queries``; keep the
    others' candidates as they are (one batched search, no per-event Python).

    Args:
        counts: int64[E] candidates per event (0 for each event of ``which``).
        candidate_ids: int64[sum(counts)] event-major.
        which: int64[W] the events to retrieve for, in order.
        queries: float32[W, dim] their query vectors.
        index: the index to search.
        k: candidates per retrieved event; default ``index.config.num_candidates``.

    Returns:
        The new candidate columns; ``retrieved`` is set for the events of ``which`` the index
        found items for.

    Example::

        found = search_candidates(counts, ids, np.flatnonzero(counts == 0), queries, index)
    """
    counts = np.asarray(counts, dtype=np.int64)
    retrieved = np.zeros(counts.shape[0], dtype=bool)
    if which.shape[0] == 0:
        return RetrievedCandidates(counts, candidate_ids, retrieved)
    found, _ = index.search(queries, k or index.config.num_candidates)
    valid = found >= 0
    found_counts = valid.sum(axis=1).astype(np.int64)
    # Sources back to back: the old candidates, then one segment per retrieved event.
    source = np.concatenate([candidate_ids, found[valid]])
    source_counts = np.concatenate([counts, found_counts])
    order = np.arange(counts.shape[0], dtype=np.int64)
    order[which] = counts.shape[0] + np.arange(which.shape[0], dtype=np.int64)
    new_counts = counts.copy()
    new_counts[which] = found_counts
    new_ids = source[take_segments(source_counts, order)]
    retrieved[which] = found_counts > 0
    return RetrievedCandidates(new_counts, new_ids, retrieved)
