"""Benchmarks: bare model forward vs the whole pipeline on the real stack, interleaved.

``streamrank bench model`` times the forward alone. ``streamrank bench pipeline`` alternates, in
one process, rounds of (bare forward, end-to-end batched, end-to-end one event per batch) so the
ratios are not skewed by a noisy machine drifting between separate runs.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from model.features import FeatureColumns, ModelInput, build_model_input
from model.ranker import build_ranker
from model.spec import FeatureSpec
from model.synthetic import SyntheticWorld, feature_columns
from pipeline.config import MetricsSettings, Settings, TopicsSettings
from pipeline.feature_store import FeatureStoreWriter
from pipeline.runner import ScoringPipeline
from pipeline.score import Scorer
from pipeline.synthetic_io import build_world, produce_events, redis_client, seed_world_features

log = logging.getLogger(__name__)


def batch_of_rows(
    world: SyntheticWorld, spec: FeatureSpec, rows: int, seed: int = 0
) -> FeatureColumns:
    """Feature columns of whole events holding at most ``rows`` rows (at least one event)."""
    rng = np.random.default_rng(seed)
    mean = (world.config.min_candidates + world.config.max_candidates) / 2
    events = world.sample_events(max(1, int(2 * rows / mean) + 1), rng)
    cols = feature_columns(events, world, spec)
    keep = max(1, int(np.searchsorted(np.cumsum(cols.candidate_counts), rows, side="right")))
    return cols.slice_events(0, keep)


def load_or_build_scorer(settings: Settings) -> Scorer:
    """The configured checkpoint's model, or a fresh one from the configured spec."""
    if (settings.model.checkpoint / "meta.json").exists():
        return Scorer.from_checkpoint(settings.model.checkpoint, settings.model.device)
    spec = settings.model.feature_spec()
    log.warning("no checkpoint at %s: benchmarking an untrained model", settings.model.checkpoint)
    return Scorer(build_ranker(spec, seed=0), spec, "untrained", torch.device("cpu"))


def time_forward(scorer: Scorer, inp: ModelInput, seconds: float, warmup: int = 3) -> float:
    """Forwards per second over about ``seconds`` (after ``warmup`` calls).

    Times exactly what the pipeline's forward stage runs: :meth:`Scorer.forward`.
    """
    for _ in range(warmup):
        scorer.forward(inp)
    calls = 0
    start = time.perf_counter()
    while True:
        scorer.forward(inp)
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return calls / elapsed


@dataclass
class ModelBench:
    batch_rows: int
    rows_per_s: float
    forward_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_rows": self.batch_rows,
            "rows_per_s": round(self.rows_per_s, 1),
            "forward_ms": round(self.forward_ms, 3),
        }


def bench_model(
    scorer: Scorer, world: SyntheticWorld, batch_rows: int, seconds: float
) -> ModelBench:
    """Bare forward throughput at (about) ``batch_rows`` rows per batch."""
    cols = batch_of_rows(world, scorer.spec, batch_rows)
    inp = build_model_input(cols, scorer.spec)
    per_s = time_forward(scorer, inp, seconds)
    return ModelBench(cols.num_rows, cols.num_rows * per_s, 1000.0 / per_s)


@dataclass
class PipelineBench:
    """Interleaved rounds; each list has one entry per round."""

    batch_rows: int
    bare_rows_per_s: list[float] = field(default_factory=list)
    e2e_rows_per_s: list[float] = field(default_factory=list)
    per_event_rows_per_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def med(values: list[float]) -> float:
            return round(float(np.median(values)), 1) if values else float("nan")

        ratios = [e / b for e, b in zip(self.e2e_rows_per_s, self.bare_rows_per_s, strict=False)]
        per_event = [
            p / b for p, b in zip(self.per_event_rows_per_s, self.bare_rows_per_s, strict=False)
        ]
        return {
            "batch_rows": self.batch_rows,
            "rounds": len(self.bare_rows_per_s),
            "bare_rows_per_s": med(self.bare_rows_per_s),
            "e2e_rows_per_s": med(self.e2e_rows_per_s),
            "per_event_rows_per_s": med(self.per_event_rows_per_s),
            "e2e_over_bare": [round(r, 3) for r in ratios],
            "e2e_over_bare_median": round(float(np.median(ratios)), 3) if ratios else None,
            "per_event_over_bare": [round(r, 3) for r in per_event],
        }


def _run_pipeline_once(
    settings: Settings, scorer: Scorer, world: SyntheticWorld, events: int, max_batch_rows: int
) -> float:
    """Produce ``events`` to fresh topics first, then score them all; returns rows/s.

    The backlog is in Kafka before the pipeline starts, so this measures sustained throughput
    (end-to-end latency here would only measure the backlog, and is not reported).
    """
    tag = uuid.uuid4().hex[:8]
    run_settings = settings.model_copy(
        update={
            "topics": TopicsSettings(
                input=f"bench-events-{tag}",
                output=f"bench-recs-{tag}",
                dlq=f"bench-dlq-{tag}",
                partitions=settings.topics.partitions,
                replication_factor=settings.topics.replication_factor,
            ),
            "batching": settings.batching.model_copy(update={"max_batch_rows": max_batch_rows}),
            "metrics": MetricsSettings(enabled=False),
        }
    )
    run_settings.kafka = settings.kafka.model_copy(update={"group_id": f"bench-{tag}"})
    produce_events(run_settings, world, events)
    pipeline = ScoringPipeline(run_settings, scorer)
    summary = pipeline.run(exit_when_idle_s=2.0, max_events=None)
    if summary.events_out != events:
        raise RuntimeError(f"bench run scored {summary.events_out} of {events} events")
    return summary.rows_per_s


def bench_pipeline(
    settings: Settings,
    *,
    events: int,
    per_event_events: int,
    rounds: int,
    model_seconds: float,
    report: Callable[[str], None] = print,
) -> PipelineBench:
    """Interleaved rounds of bare forward / batched pipeline / per-event pipeline.

    Seeds the world's features into Redis first (same prefix as ``settings.redis``).
    """
    scorer = load_or_build_scorer(settings)
    world = build_world(settings)
    seed_world_features(
        world, FeatureStoreWriter(redis_client(settings), settings.redis.key_prefix)
    )
    batch_rows = settings.batching.max_batch_rows
    result = PipelineBench(batch_rows=batch_rows)
    for r in range(rounds):
        bare = bench_model(scorer, world, batch_rows, model_seconds)
        result.bare_rows_per_s.append(bare.rows_per_s)
        report(
            f"round {r + 1}: bare forward {bare.rows_per_s:,.0f} rows/s ({bare.batch_rows} rows)"
        )
        rows_per_s = _run_pipeline_once(settings, scorer, world, events, batch_rows)
        result.e2e_rows_per_s.append(rows_per_s)
        report(f"round {r + 1}: end-to-end batched {rows_per_s:,.0f} rows/s")
        if per_event_events:
            rows_per_s = _run_pipeline_once(settings, scorer, world, per_event_events, 1)
            result.per_event_rows_per_s.append(rows_per_s)
            report(f"round {r + 1}: end-to-end one event per batch {rows_per_s:,.0f} rows/s")
    return result
