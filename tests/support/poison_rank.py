"""``python -m tests.support.poison_rank ARGS``: ``streamrank ARGS`` whose scorer fails for one
event, in every process (``streamrank run --nproc N`` started through this module starts its
ranks through it too: :func:`pipeline.jobs.launch.entry_module`).

A tests-only entry module wrapping the real one: the served scorer is wrapped in
:class:`tests.support.faults.FailingScorer`, whose top-K (after the collective forward) fails for
a batch holding an event with ``num_results`` = :data:`POISON_RESULTS`.
"""

from __future__ import annotations

from model.serving import Scorer, ScorerFactory
from pipeline.cli import app
from tests.support.faults import FailingScorer

POISON_RESULTS = 999


def _failing(create: object) -> object:
    def create_scorer(self: ScorerFactory) -> Scorer:
        return FailingScorer(create(self), {POISON_RESULTS})  # type: ignore[operator]

    return create_scorer


if __name__ == "__main__":
    ScorerFactory.create_scorer = _failing(ScorerFactory.create_scorer)  # type: ignore[method-assign]
    app()
