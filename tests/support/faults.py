"""Processing failures injected through what the serving code takes as arguments.

The pipeline takes its enricher and its scorer as arguments; these wrappers fail for chosen
events and otherwise pass through, so poison isolation is tested without any hook in the
serving packages (``tests/pipeline/test_architecture.py`` greps them for one).

- :class:`FailingEnricher`: raises while a batch is enriched when it holds a poison user id
  (the steps before the forward).
- :class:`FailingScorer`: raises in the top-K of a batch that holds an event asking for the
  poison ``num_results`` (the scoring step, on the scoring thread).

Example::

    pipeline = ScoringPipeline(settings, FailingScorer(scorer, {999}), enricher=FailingEnricher(
        enricher, {7}))
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt
import torch

from model.serving import Scorer
from model.serving.topk import TopK
from pipeline.stages.enrich.enricher import BatchEnricher
from pipeline.types import Enrichment


class InjectedFault(RuntimeError):
    """The failure the wrappers raise (an ordinary error: it may come from the events)."""


class FailingEnricher:
    """An enricher that fails for batches holding one of ``user_ids``.

    Args:
        inner: the real enricher.
        user_ids: poison user ids.
    """

    def __init__(self, inner: BatchEnricher, user_ids: Iterable[int]) -> None:
        self._inner = inner
        self._poison = np.fromiter(user_ids, np.int64)

    def enrich(
        self, user_ids: npt.NDArray[np.int64], item_ids: npt.NDArray[np.int64]
    ) -> Enrichment:
        hit = np.intersect1d(user_ids, self._poison)
        if len(hit):
            raise InjectedFault(f"injected enrich failure for user {int(hit[0])}")
        return self._inner.enrich(user_ids, item_ids)


class FailingScorer(Scorer):
    """A scorer whose top-K fails for batches holding an event with one of ``num_results``.

    Args:
        inner: the real scorer (its model, spec, device and version are shared).
        num_results: poison values of ``UserEvent.num_results``.
    """

    def __init__(self, inner: Scorer, num_results: Iterable[int]) -> None:
        super().__init__(
            inner.module, inner.spec, inner.model_version, inner.device, inner.precision
        )
        self._poison = np.fromiter(num_results, np.int64)

    def top_k(
        self,
        probs: torch.Tensor,
        candidate_counts: npt.NDArray[np.int64],
        num_results: npt.NDArray[np.int64],
    ) -> TopK:
        hit = np.intersect1d(num_results, self._poison)
        if len(hit):
            raise InjectedFault(f"injected scoring failure for num_results {int(hit[0])}")
        return super().top_k(probs, candidate_counts, num_results)
