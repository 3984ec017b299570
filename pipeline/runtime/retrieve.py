"""Retrieval: events that came without candidates get retrieved ones, right after decoding.

With ``[retrieval]`` on, the decode stage accepts an empty ``candidate_item_ids`` (it asks
"what should this user see?"). Before the events join a batch (the batcher counts rows, i.e.
candidates), :class:`CandidateRetriever` gives each such event the ``num_candidates`` best
items of the served model's retrieval index (:func:`model.retrieval.candidates.fill_candidates`, one
batched search per poll) and sets its ``retrieved`` flag, which the Recommendation carries.
An event left without candidates (no index: an empty catalogue; or nothing found) is
dead-lettered as ``no_candidates``, like an event without candidates when retrieval is off.

The index belongs to one model version: the loop swaps it together with the scorer
(:mod:`pipeline.runtime.model_swap`), and only when nothing retrieved with the old index still waits
to be scored, so the candidates of every batch come from the version that scores it.

Example::

    retriever = CandidateRetriever(index, num_candidates=100, metrics=metrics)
    decoded = retriever.fill(decoder.decode(polled))
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from pipeline.types import DecodedMessages, EventColumns, RejectedMessage, RejectReason

if TYPE_CHECKING:
    from model.retrieval.candidates import RetrievedCandidates
    from model.retrieval.index import RetrievalIndex
    from pipeline.observability.metrics import Metrics

__all__ = ["CandidateRetriever"]


class CandidateRetriever:
    """Fills in the candidates of decoded events that have none.

    Args:
        index: the served model version's retrieval index; ``None``: nothing to retrieve
            from (events without candidates are dead-lettered).
        num_candidates: items retrieved per event (``retrieval.num_candidates``).
        metrics: the ``retrieve`` stage time and ``streamrank_retrieved_events_total``.

    Attributes:
        index: replaced by the loop when a new model version is swapped in.
    """

    def __init__(
        self, index: RetrievalIndex | None, num_candidates: int, metrics: Metrics | None = None
    ) -> None:
        self.index = index
        self.num_candidates = num_candidates
        self._metrics = metrics

    def fill(self, decoded: DecodedMessages) -> DecodedMessages:
        """``decoded`` with retrieved candidates for its events that have none.

        Args:
            decoded: a poll's messages as the decode stage made them.

        Returns:
            The same messages: events without candidates now have ``num_candidates`` (or as
            many as the index found) with ``retrieved`` set; those still without any are
            rejected (``no_candidates``).
        """
        events = decoded.events
        empty = events.candidate_counts == 0
        if not empty.any():
            return decoded
        index = self.index
        if index is None:
            detail = "candidate_item_ids is empty and there is no retrieval index (no catalogue)"
        else:
            found = self._search(events, index)
            events = dataclasses.replace(
                events,
                candidate_counts=found.candidate_counts,
                candidate_ids=found.candidate_ids,
                retrieved=found.retrieved,
            )
            decoded = decoded.with_events(events)
            empty = found.candidate_counts == 0
            detail = (
                f"candidate_item_ids is empty and the index of {index.model_version} found none"
            )
        if empty.any():
            rejection = RejectedMessage(RejectReason.NO_CANDIDATES, detail)
            decoded = decoded.reject_events(np.flatnonzero(empty), rejection)
        return decoded

    def _search(self, events: EventColumns, index: RetrievalIndex) -> RetrievedCandidates:
        from model.retrieval.candidates import fill_candidates  # Faiss: only once there is an index

        metrics = self._metrics
        if metrics is None:
            return fill_candidates(events, index, self.num_candidates)
        with metrics.stage("retrieve"):
            found = fill_candidates(events, index, self.num_candidates)
        metrics.retrieved_events.inc(int(np.count_nonzero(found.retrieved)))
        return found
