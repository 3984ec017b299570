"""Benchmarks: bare model forward vs the whole pipeline on the real stack, interleaved.

``streamrank bench model`` times the forward alone. ``streamrank bench pipeline`` alternates, in
one process, rounds of (bare forward, end-to-end batched, end-to-end one event per batch) so the
ratios are not skewed by a noisy machine drifting between separate runs.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.compile import maybe_compile
from model.features import FeatureColumns, ModelInput, build_model_input
from model.quantize import compare_quantized, quantize_ranker
from model.ranker import Ranker, build_ranker
from model.spec import FeatureSpec
from model.synthetic import SyntheticWorld, feature_columns
from pipeline.config import MetricsSettings, Settings, TopicsSettings
from pipeline.feature_store import FeatureStoreWriter
from pipeline.runner import ScoringPipeline
from pipeline.score import Scorer
from pipeline.tools.synthetic_io import build_world, produce_events, redis_client, seed_world_features

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
        model = settings.model
        return Scorer.from_checkpoint(model.checkpoint, model.device, model.quantize, model.compile)
    spec = settings.model.feature_spec()
    log.warning("no checkpoint at %s: benchmarking an untrained model", settings.model.checkpoint)
    return Scorer(build_ranker(spec, seed=0), spec, "untrained", torch.device("cpu"))


def _plain_scorer(settings: Settings) -> Scorer:
    """The configured model as fp32 and eager (the baseline of the quantize/compile benches)."""
    plain = settings.model.model_copy(update={"quantize": "fp32", "compile": False})
    return load_or_build_scorer(settings.model_copy(update={"model": plain}))


def fresh_topics(settings: Settings, partitions: int | None = None) -> tuple[TopicsSettings, str]:
    """Topics (and a tag for the consumer group) no earlier run has used."""
    tag = uuid.uuid4().hex[:8]
    topics = TopicsSettings(
        input=f"bench-events-{tag}",
        output=f"bench-recs-{tag}",
        dlq=f"bench-dlq-{tag}",
        partitions=partitions or settings.topics.partitions,
        replication_factor=settings.topics.replication_factor,
    )
    return topics, tag


def time_forward_rows(scorer: Scorer, inputs: list[ModelInput], seconds: float) -> float:
    """Rows per second scoring ``inputs`` in turn for about ``seconds`` (after one warm pass).

    Times exactly what the pipeline's forward stage runs: :meth:`Scorer.forward`.
    """
    for inp in inputs:
        scorer.forward(inp)
    rows = calls = 0
    start = time.perf_counter()
    while True:
        inp = inputs[calls % len(inputs)]
        scorer.forward(inp)
        rows += inp.num_rows
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return rows / elapsed


@dataclass
class ModelBench:
    """Bare forward throughput.

    Attributes:
        batch_rows: rows of the first batch (all hold whole events, at most the batch size).
        rows_per_s: over ``distinct_batches`` different batches scored in turn, as a stream
            presents them (different ids each time: the embedding rows are not cache-hot).
        same_batch_rows_per_s: one batch scored again and again (cache-hot best case).
    """

    batch_rows: int
    rows_per_s: float
    same_batch_rows_per_s: float
    distinct_batches: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_rows": self.batch_rows,
            "rows_per_s": round(self.rows_per_s, 1),
            "same_batch_rows_per_s": round(self.same_batch_rows_per_s, 1),
            "distinct_batches": self.distinct_batches,
        }


def bench_model(
    scorer: Scorer,
    world: SyntheticWorld,
    batch_rows: int,
    seconds: float,
    distinct_batches: int = 16,
) -> ModelBench:
    """Bare forward throughput at (about) ``batch_rows`` rows per batch.

    Times :meth:`Scorer.forward` alone on ``distinct_batches`` prepared batches in turn
    (``seconds``), then on the first one repeated (``seconds``).
    """
    inputs = [
        build_model_input(batch_of_rows(world, scorer.spec, batch_rows, seed=i), scorer.spec)
        for i in range(distinct_batches)
    ]
    distinct = time_forward_rows(scorer, inputs, seconds)
    same = time_forward_rows(scorer, inputs[:1], seconds)
    return ModelBench(inputs[0].num_rows, distinct, same, distinct_batches)


@dataclass
class PipelineBench:
    """Interleaved rounds; each list has one entry per round."""

    batch_rows: int
    bare_rows_per_s: list[float] = field(default_factory=list)
    bare_same_batch_rows_per_s: list[float] = field(default_factory=list)
    e2e_rows_per_s: list[float] = field(default_factory=list)
    per_event_rows_per_s: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def med(values: list[float]) -> float:
            return round(float(np.median(values)), 1) if values else float("nan")

        ratios = [e / b for e, b in zip(self.e2e_rows_per_s, self.bare_rows_per_s, strict=False)]
        hot = [
            e / b
            for e, b in zip(self.e2e_rows_per_s, self.bare_same_batch_rows_per_s, strict=False)
        ]
        per_event = [
            p / b for p, b in zip(self.per_event_rows_per_s, self.bare_rows_per_s, strict=False)
        ]
        return {
            "batch_rows": self.batch_rows,
            "rounds": len(self.bare_rows_per_s),
            "bare_rows_per_s": med(self.bare_rows_per_s),
            "bare_same_batch_rows_per_s": med(self.bare_same_batch_rows_per_s),
            "e2e_rows_per_s": med(self.e2e_rows_per_s),
            "per_event_rows_per_s": med(self.per_event_rows_per_s),
            "e2e_over_bare": [round(r, 3) for r in ratios],
            "e2e_over_bare_median": round(float(np.median(ratios)), 3) if ratios else None,
            "e2e_over_bare_same_batch": [round(r, 3) for r in hot],
            "per_event_over_bare": [round(r, 3) for r in per_event],
        }


def _run_pipeline_once(
    settings: Settings, scorer: Scorer, world: SyntheticWorld, events: int, max_batch_rows: int
) -> float:
    """Produce ``events`` to fresh topics first, then score them all; returns rows/s.

    The backlog is in Kafka before the pipeline starts, so this measures sustained throughput
    (end-to-end latency here would only measure the backlog, and is not reported).
    """
    topics, tag = fresh_topics(settings)
    run_settings = settings.model_copy(
        update={
            "topics": topics,
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
        result.bare_same_batch_rows_per_s.append(bare.same_batch_rows_per_s)
        report(
            f"round {r + 1}: bare forward {bare.rows_per_s:,.0f} rows/s over "
            f"{bare.distinct_batches} distinct batches, {bare.same_batch_rows_per_s:,.0f} on one "
            f"batch repeated ({bare.batch_rows} rows)"
        )
        rows_per_s = _run_pipeline_once(settings, scorer, world, events, batch_rows)
        result.e2e_rows_per_s.append(rows_per_s)
        report(f"round {r + 1}: end-to-end batched {rows_per_s:,.0f} rows/s")
        if per_event_events:
            rows_per_s = _run_pipeline_once(settings, scorer, world, per_event_events, 1)
            result.per_event_rows_per_s.append(rows_per_s)
            report(f"round {r + 1}: end-to-end one event per batch {rows_per_s:,.0f} rows/s")
    return result


def bench_quantization(
    settings: Settings, batch_rows: int, seconds: float, dtypes: tuple[str, ...] = ("fp16", "int8")
) -> list[dict[str, Any]]:
    """Embedding bytes, max |score change| and forward rows/s of quantized tables vs fp32.

    The fp32 model and each quantized copy are timed in alternation on the same batch.
    """
    scorer = _plain_scorer(settings)
    ranker = scorer.ranker
    assert isinstance(ranker, Ranker)
    world = build_world(settings)
    cols = batch_of_rows(world, scorer.spec, batch_rows)
    inp = build_model_input(cols, scorer.spec)
    rows = []
    for dtype in dtypes:
        quantized = quantize_ranker(ranker, dtype)
        report = compare_quantized(ranker, quantized, inp, dtype)
        q_scorer = Scorer(quantized, scorer.spec, scorer.model_version, scorer.device)
        fp32_per_s = time_forward_rows(scorer, [inp], seconds)
        q_per_s = time_forward_rows(q_scorer, [inp], seconds)
        rows.append(
            {
                "dtype": dtype,
                "batch_rows": cols.num_rows,
                "fp32_bytes": report.fp32_bytes,
                "bytes": report.quant_bytes,
                "bytes_ratio": round(report.ratio, 3),
                "max_abs_score_diff": report.max_abs_score_diff,
                "fp32_rows_per_s": round(fp32_per_s, 1),
                "rows_per_s": round(q_per_s, 1),
            }
        )
    return rows


def bench_compile(
    settings: Settings, batch_rows: int, seconds: float, rounds: int
) -> dict[str, Any]:
    """Forward rows/s with and without ``torch.compile``, interleaved; compile time apart."""
    eager = _plain_scorer(settings)
    world = build_world(settings)
    cols = batch_of_rows(world, eager.spec, batch_rows)
    inp = build_model_input(cols, eager.spec)
    compiled_module = maybe_compile(copy.deepcopy(eager.ranker), True)
    compiled = Scorer(compiled_module, eager.spec, eager.model_version, eager.device)
    start = time.perf_counter()
    compiled_probs = compiled.forward(inp)
    compile_s = time.perf_counter() - start
    max_diff = float((compiled_probs - eager.forward(inp)).abs().max())
    eager_rates, compiled_rates = [], []
    for _ in range(rounds):
        eager_rates.append(time_forward_rows(eager, [inp], seconds))
        compiled_rates.append(time_forward_rows(compiled, [inp], seconds))
    ratios = [c / e for c, e in zip(compiled_rates, eager_rates, strict=True)]
    return {
        "batch_rows": cols.num_rows,
        "first_compile_s": round(compile_s, 1),
        "eager_rows_per_s": [round(r, 1) for r in eager_rates],
        "compiled_rows_per_s": [round(r, 1) for r in compiled_rates],
        "compiled_over_eager": [round(r, 3) for r in ratios],
        "compiled_over_eager_median": round(float(np.median(ratios)), 3),
        "max_abs_score_diff": max_diff,
    }


def _run_ranks_once(
    settings: Settings, world: SyntheticWorld, events: int, nproc: int
) -> dict[str, Any]:
    """Produce ``events`` to fresh topics, then ``streamrank run --nproc N`` until idle."""
    topics, tag = fresh_topics(settings, max(settings.topics.partitions, nproc))
    run_settings = settings.model_copy(update={"topics": topics})
    produce_events(run_settings, world, events)
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        env = {
            **os.environ,
            "STREAMRANK_TOPICS__INPUT": topics.input,
            "STREAMRANK_TOPICS__OUTPUT": topics.output,
            "STREAMRANK_TOPICS__DLQ": topics.dlq,
            "STREAMRANK_TOPICS__PARTITIONS": str(topics.partitions),
            "STREAMRANK_KAFKA__GROUP_ID": f"bench-{tag}",
            "STREAMRANK_METRICS__ENABLED": "false",
        }
        cmd = [
            sys.executable,
            "-m",
            "pipeline.cli",
            "run",
            "--nproc",
            str(nproc),
            "--exit-when-idle",
            "3",
            "--summary-json",
            str(summary),
        ]
        subprocess.run(
            cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        files = [summary] + [summary.with_suffix(f".rank{r}.json") for r in range(1, nproc)]
        parts = [json.loads(f.read_text()) for f in files]
    rows = sum(p["rows_scored"] for p in parts)
    out = sum(p["events_out"] for p in parts)
    if out < events:
        raise RuntimeError(f"{nproc}-rank run scored {out} of {events} events")
    busy = max(p["busy_seconds"] for p in parts)
    return {
        "rows_per_s": rows / busy if busy else 0.0,
        "rank_rows": [p["rows_scored"] for p in parts],
    }


def bench_ranks(
    settings: Settings,
    events: int,
    rounds: int,
    nprocs: tuple[int, ...] = (1, 2),
    report: Callable[[str], None] = print,
) -> dict[str, Any]:
    """End-to-end rows/s with 1 vs N ranks (interleaved rounds) and per-rank embedding bytes."""
    from model.checkpoint import load_spec
    from model.sharding import ShardingConfig, describe_plan, plan_sharding

    world = build_world(settings)
    seed_world_features(
        world, FeatureStoreWriter(redis_client(settings), settings.redis.key_prefix)
    )
    spec = load_spec(settings.model.checkpoint)
    memory = {}
    for n in nprocs:
        plan = plan_sharding(
            spec,
            n,
            "cpu",
            ShardingConfig.parse(settings.model.sharding),
            batch_rows=settings.batching.max_batch_rows,
        )
        memory[n] = describe_plan(plan, spec, n).as_dict()["ranks"]
    rates: dict[int, list[float]] = {n: [] for n in nprocs}
    for r in range(rounds):
        for n in nprocs:
            result = _run_ranks_once(settings, world, events, n)
            rates[n].append(result["rows_per_s"])
            report(
                f"round {r + 1}: {n} rank(s) {result['rows_per_s']:,.0f} rows/s "
                f"(rows per rank {result['rank_rows']})"
            )
    base = nprocs[0]
    return {
        "events": events,
        "batch_rows": settings.batching.max_batch_rows,
        "rows_per_s": {str(n): [round(v, 1) for v in rates[n]] for n in nprocs},
        "ratio_over_1_rank": {
            str(n): [round(a / b, 3) for a, b in zip(rates[n], rates[base], strict=True)]
            for n in nprocs
        },
        "embedding_bytes_per_rank": {str(n): memory[n] for n in nprocs},
    }
