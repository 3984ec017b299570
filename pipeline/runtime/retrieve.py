"""Retrieval: events that came without candidates get retrieved ones, right after decoding.

With ``[retrieval]`` on, the decode stage accepts an empty candidate list (it asks "what
should this user see?"). Before the events join a batch (the batcher counts rows, i.e.
candidates), :class:`CandidateRetriever` gives each such event the ``num_candidates`` best
items of the served model's retrieval index (one batched search per poll) and sets its
``retrieved`` flag, which the output carries. An event left without candidates (no index: an
empty catalogue; no query vector: a configured model whose query is a field of the user's
Redis record, missing for this user; or nothing found) is dead-lettered as ``no_candidates``,
like an event without candidates when retrieval is off.

The query: the built-in model's is the sum of its event-side embeddings
(:func:`model.retrieval.candidates.fill_candidates`); a configured model's is the row of one
of its tables that the user id looks up, or a vector field of the user's Redis record, read
through the loop's enricher (its cache, one round trip, its outage behaviour; the batch's own
enrich then finds those users cached) (:class:`~pipeline.models.configured_index.ConfiguredIndex`).

The index belongs to one model version: the loop swaps it together with the scorer
(:mod:`pipeline.runtime.model_swap`), and only when nothing retrieved with the old index still waits
to be scored, so the candidates of every batch come from the version that scores it.

Example::

    retriever = CandidateRetriever(index, metrics=metrics, enricher=enricher)
    decoded = retriever.fill(decoder.decode(polled))
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pipeline.types import DecodedMessages, EventColumns, RejectedMessage, RejectReason

if TYPE_CHECKING:
    from model.retrieval.candidates import RetrievedCandidates
    from model.retrieval.index import VectorIndex
    from pipeline.observability.metrics import Metrics
    from pipeline.stages.enrich.enricher import BatchEnricher

__all__ = ["CandidateRetriever"]

_EMPTY = "candidate_item_ids is empty and"


class CandidateRetriever:
    """Fills in the candidates of decoded events that have none.

    Args:
        index: the served model version's retrieval index; ``None``: nothing to retrieve
            from (events without candidates are dead-lettered).
        num_candidates: items retrieved per event; default: the searched index's own
            (``index.config.num_candidates``: ``retrieval.num_candidates`` of the config the
            model loader built it with).
        metrics: the ``retrieve`` stage time and ``streamrank_retrieved_events_total``.
        enricher: reads the users' Redis records, for a configured model whose query is a
            field of them (the loop's enricher: one cache for both).

    Attributes:
        index: replaced by the loop when a new model version is swapped in.
    """

    def __init__(
        self,
        index: VectorIndex | None,
        num_candidates: int | None = None,
        metrics: Metrics | None = None,
        enricher: BatchEnricher | None = None,
    ) -> None:
        self.index = index
        self.num_candidates = num_candidates
        self._metrics = metrics
        self._enricher = enricher

    def fill(self, decoded: DecodedMessages) -> DecodedMessages:
        """``decoded`` with retrieved candidates for its events that have none.

        Args:
            decoded: a poll's messages as the decode stage made them.

        Returns:
            The same messages: events without candidates now have ``num_candidates`` (or as
            many as the index found) with ``retrieved`` set; those still without any are
            rejected (``no_candidates``, the detail says why).
        """
        events = decoded.events
        empty = events.candidate_counts == 0
        if not empty.any():
            return decoded
        index = self.index
        if index is None:
            detail = f"{_EMPTY} there is no retrieval index (no catalogue)"
            return decoded.reject_events(
                np.flatnonzero(empty), RejectedMessage(RejectReason.NO_CANDIDATES, detail)
            )
        metrics = self._metrics
        if metrics is None:
            found, unqueried = self._search(events, index)
        else:
            with metrics.stage("retrieve"):
                found, unqueried = self._search(events, index)
            metrics.retrieved_events.inc(int(np.count_nonzero(found.retrieved)))
        events = dataclasses.replace(
            events,
            candidate_counts=found.candidate_counts,
            candidate_ids=found.candidate_ids,
            retrieved=found.retrieved,
        )
        decoded = decoded.with_events(events)
        none = (found.candidate_counts == 0) & ~unqueried
        detail = f"{_EMPTY} the index of {index.model_version} found none"
        decoded = decoded.reject_events(
            np.flatnonzero(none), RejectedMessage(RejectReason.NO_CANDIDATES, detail)
        )
        if unqueried.any():
            after = np.cumsum(~none) - 1  # each event's place once ``none`` are gone
            detail = f"{_EMPTY} the user has no query vector ({_query_name(index)})"
            decoded = decoded.reject_events(
                after[np.flatnonzero(unqueried)],
                RejectedMessage(RejectReason.NO_CANDIDATES, detail),
            )
        return decoded

    def _search(
        self, events: EventColumns, index: VectorIndex
    ) -> tuple[RetrievedCandidates, npt.NDArray[np.bool_]]:
        """The new candidate columns, and which events had no query vector."""
        # Faiss and the configured index: only once there is an index.
        from model.retrieval.candidates import fill_candidates, search_candidates
        from model.retrieval.index import RetrievalIndex
        from pipeline.models.configured_index import ConfiguredIndex

        counts = events.candidate_counts
        unqueried = np.zeros(counts.shape[0], dtype=bool)
        if isinstance(index, RetrievalIndex):
            return fill_candidates(events, index, self.num_candidates), unqueried
        assert isinstance(index, ConfiguredIndex)
        which = np.flatnonzero(counts == 0)
        users = events.user_ids[which]
        if index.reads_users:
            fields = None
            if self._enricher is not None:
                fields = self._enricher.enrich(users, np.zeros(0, np.int64)).user_fields
            queries, ok = index.record_queries(fields, len(users))
            unqueried[which[~ok]] = True
            which, queries = which[ok], queries[ok]
        else:
            queries = index.table_queries(users)
        found = search_candidates(
            counts, events.candidate_ids, which, queries, index, self.num_candidates
        )
        return found, unqueried


def _query_name(index: VectorIndex) -> str:
    """What the query is, for the dead letter's detail (a configured index's Redis field)."""
    from pipeline.models.configured_index import ConfiguredIndex

    return index.query_name if isinstance(index, ConfiguredIndex) else "retrieval.query"
