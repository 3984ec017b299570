"""``streamrank bench pipeline``: bare forward vs the whole pipeline on the real stack.

Alternates, in one process, rounds of (bare forward, end-to-end batched, end-to-end one event
per batch) so the ratios are not skewed by a noisy machine drifting between separate runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model.serving import Scorer
from model.synthetic import SyntheticWorld
from pipeline.observability.summary import RunSummary
from pipeline.runtime.loop import ScoringPipeline
from pipeline.settings.loading import Settings
from pipeline.settings.metrics import MetricsSettings
from pipeline.tools.bench.common import (
    BenchTopics,
    delete_run_topics,
    fresh_topics,
    load_or_build_scorer,
    seeded_world,
)
from pipeline.tools.bench.model import bench_model
from pipeline.tools.synthetic_io import produce_events


def _median(values: list[float]) -> float:
    return round(float(np.median(values)), 1) if values else float("nan")


def _ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    return [n / d for n, d in zip(numerators, denominators, strict=False)]


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 3) for v in values]


@dataclass
class PipelineBench:
    """Interleaved rounds; each list has one entry per round."""

    batch_rows: int
    bare_rows_per_s: list[float] = field(default_factory=list)
    bare_same_batch_rows_per_s: list[float] = field(default_factory=list)
    e2e_rows_per_s: list[float] = field(default_factory=list)
    per_event_rows_per_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Medians over the rounds and the per-round ratios end-to-end / bare."""
        ratios = _ratios(self.e2e_rows_per_s, self.bare_rows_per_s)
        return {
            "batch_rows": self.batch_rows,
            "rounds": len(self.bare_rows_per_s),
            "bare_rows_per_s": _median(self.bare_rows_per_s),
            "bare_same_batch_rows_per_s": _median(self.bare_same_batch_rows_per_s),
            "e2e_rows_per_s": _median(self.e2e_rows_per_s),
            "per_event_rows_per_s": _median(self.per_event_rows_per_s),
            "e2e_over_bare": _rounded(ratios),
            "e2e_over_bare_median": round(float(np.median(ratios)), 3) if ratios else None,
            "e2e_over_bare_same_batch": _rounded(
                _ratios(self.e2e_rows_per_s, self.bare_same_batch_rows_per_s)
            ),
            "per_event_over_bare": _rounded(
                _ratios(self.per_event_rows_per_s, self.bare_rows_per_s)
            ),
        }


def drain_backlog(
    settings: Settings,
    scorer: Scorer,
    world: SyntheticWorld,
    events: int,
    max_batch_rows: int,
    topics_of_bench: BenchTopics | None = None,
) -> RunSummary:
    """Produce ``events`` to fresh topics first, then score them all (the topics are deleted:
    by ``topics_of_bench`` when the benchmark ends, or here).

    The backlog is in Kafka before the pipeline starts, so ``events_per_s``/``rows_per_s`` of
    the summary are sustained throughput: capacity (end-to-end latency here would only measure
    the backlog).

    Args:
        settings: the stack and the pipeline's configuration.
        scorer: the model.
        world: where the events come from (its features already in Redis).
        events: the backlog.
        max_batch_rows: ``batching.max_batch_rows`` of this run.

    Returns:
        The run's summary.

    Raises:
        RuntimeError: not every event was scored.

    Example::

        drain_backlog(settings, scorer, seeded_world(settings), 5000, 4096).events_per_s
    """
    topics, tag = topics_of_bench.fresh() if topics_of_bench else fresh_topics(settings)
    run_settings = settings.model_copy(
        update={
            "topics": topics,
            "batching": settings.batching.model_copy(update={"max_batch_rows": max_batch_rows}),
            "metrics": MetricsSettings(enabled=False),
            "kafka": settings.kafka.model_copy(update={"group_id": f"bench-{tag}"}),
        }
    )
    try:
        produce_events(run_settings, world, events)
        summary = ScoringPipeline(run_settings, scorer).run(exit_when_idle_s=2.0, max_events=None)
    finally:
        if topics_of_bench is None:
            delete_run_topics(run_settings)
    if summary.events_out != events:
        raise RuntimeError(f"bench run scored {summary.events_out} of {events} events")
    return summary


def bench_pipeline(
    settings: Settings,
    *,
    events: int,
    per_event_events: int,
    rounds: int,
    model_seconds: float,
    report: Callable[[str], None] = print,
    keep_topics: bool = False,
) -> PipelineBench:
    """Interleaved rounds of bare forward / batched pipeline / per-event pipeline.

    Seeds the world's features into Redis first (same prefix as ``settings.redis``).

    Args:
        settings: the stack, the model and ``batching.max_batch_rows``.
        events: events per batched end-to-end run.
        per_event_events: events per one-event-per-batch run (0 skips those runs).
        rounds: interleaved rounds.
        model_seconds: bare forward timing per round.
        report: called with one line of progress per measurement.
        keep_topics: keep the topics of the end-to-end runs (default: deleted at the end).

    Returns:
        The :class:`PipelineBench` numbers of every round.

    Example::

        bench_pipeline(settings, events=5000, per_event_events=500, rounds=3, model_seconds=3)
    """
    scorer = load_or_build_scorer(settings)
    world = seeded_world(settings)
    batch_rows = settings.batching.max_batch_rows
    result = PipelineBench(batch_rows=batch_rows)
    with BenchTopics(settings, keep_topics) as topics:
        for r in range(rounds):
            bare = bench_model(scorer, world, batch_rows, model_seconds)
            result.bare_rows_per_s.append(bare.rows_per_s)
            result.bare_same_batch_rows_per_s.append(bare.same_batch_rows_per_s)
            report(
                f"round {r + 1}: bare forward {bare.rows_per_s:,.0f} rows/s over "
                f"{bare.distinct_batches} distinct batches, {bare.same_batch_rows_per_s:,.0f} "
                f"on one batch repeated ({bare.batch_rows} rows)"
            )
            rows_per_s = drain_backlog(
                settings, scorer, world, events, batch_rows, topics
            ).rows_per_s
            result.e2e_rows_per_s.append(rows_per_s)
            report(f"round {r + 1}: end-to-end batched {rows_per_s:,.0f} rows/s")
            if per_event_events:
                rows_per_s = drain_backlog(
                    settings, scorer, world, per_event_events, 1, topics
                ).rows_per_s
                result.per_event_rows_per_s.append(rows_per_s)
                report(f"round {r + 1}: end-to-end one event per batch {rows_per_s:,.0f} rows/s")
    return result
