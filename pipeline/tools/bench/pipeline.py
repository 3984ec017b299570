"""``streamrank bench pipeline``: bare forward vs the whole pipeline on the real stack.

Alternates, in one process, rounds of (bare forward, end-to-end batched, end-to-end one event
per batch) so the ratios are not skewed by a noisy machine drifting between separate runs. The
pipeline is the one ``streamrank run`` builds (:mod:`pipeline.tools.bench.served`: the report's
``pipeline`` entry says what it ran and what it left out). Each batched run's batches are
replayed alone afterwards and its CPU is accounted per thread and per process (``replay``,
``cpu``). With ``[model.module]`` the events are synthesized from its schema and its Redis
records from its layouts (:mod:`pipeline.tools.bench.workload`), and the model is its version
(or the module untrained: the report's ``pipeline`` says which).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.observability.summary import RunSummary
from pipeline.runtime.loop import ScoringPipeline
from pipeline.settings.loading import Settings
from pipeline.tools.bench.common import BenchTopics
from pipeline.tools.bench.cpu_account import CpuAccount
from pipeline.tools.bench.model import bench_model
from pipeline.tools.bench.replay import Recording, RecordingScorer, replay
from pipeline.tools.bench.served import bench_checkpoint, bench_pipeline_of, describe
from pipeline.tools.bench.workload import Workload, workload


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
    replays: list[dict[str, Any]] = field(default_factory=list)
    """Per round: the batched run's batches replayed alone (:mod:`.replay`)."""
    cpu_accounts: list[dict[str, Any]] = field(default_factory=list)
    """Per round: the batched run's CPU per thread and process (:mod:`.cpu_account`)."""
    pipeline: dict[str, Any] = field(default_factory=dict)
    """What the end-to-end runs ran (:func:`~pipeline.tools.bench.served.describe`)."""
    variant: list[str] = field(default_factory=list)
    """Settings changed in the variant run of each round (``--variant``)."""
    variant_rows_per_s: list[float] = field(default_factory=list)

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
            "variant": self.variant,
            "variant_rows_per_s": _median(self.variant_rows_per_s),
            "variant_over_e2e": _rounded(_ratios(self.variant_rows_per_s, self.e2e_rows_per_s)),
            "replay": self.replays,
            "cpu": self.cpu_accounts,
            "pipeline": self.pipeline,
        }


def backlog(
    settings: Settings,
    load: Workload,
    events: int,
    max_batch_rows: int,
    topics_of_bench: BenchTopics,
) -> Settings:
    """Produce ``events`` to fresh topics; the settings of a run that drains them.

    Args:
        settings: the stack and the pipeline's configuration.
        load: where the events come from (its features already in Redis).
        events: the backlog.
        max_batch_rows: ``batching.max_batch_rows`` of the run.
        topics_of_bench: makes the topics (and deletes them when the benchmark ends).

    Returns:
        ``settings`` on the new topics, with a fresh consumer group and that batch size.
    """
    topics, tag = topics_of_bench.fresh()
    run_settings = settings.model_copy(
        update={
            "topics": topics,
            "batching": settings.batching.model_copy(update={"max_batch_rows": max_batch_rows}),
            "kafka": settings.kafka.model_copy(update={"group_id": f"bench-{tag}"}),
        }
    )
    load.produce(run_settings, events)
    return run_settings


def drain(pipeline: ScoringPipeline, events: int) -> RunSummary:
    """Score the backlog already on the pipeline's input topic, until idle for 2 s.

    The backlog is in Kafka before the pipeline starts, so ``events_per_s``/``rows_per_s`` of
    the summary are sustained throughput: capacity (end-to-end latency here would only measure
    the backlog).

    Raises:
        RuntimeError: not every event was scored.
    """
    summary = pipeline.run(exit_when_idle_s=2.0, max_events=None)
    if summary.events_out != events:
        raise RuntimeError(f"bench run scored {summary.events_out} of {events} events")
    return summary


def drain_backlog(
    settings: Settings,
    checkpoint: Path,
    load: Workload,
    events: int,
    max_batch_rows: int,
) -> tuple[RunSummary, ScoringPipeline]:
    """Produce ``events`` to fresh topics, then score them all with the pipeline ``streamrank
    run`` builds (:func:`~pipeline.tools.bench.served.bench_pipeline_of`); the topics are
    deleted after.

    Args:
        settings: the stack and the pipeline's configuration.
        checkpoint: the checkpoint served (:func:`~pipeline.tools.bench.served.bench_checkpoint`).
        load: where the events come from (its features already in Redis).
        events: the backlog.
        max_batch_rows: ``batching.max_batch_rows`` of this run.

    Returns:
        The run's summary, and the pipeline that ran.

    Raises:
        RuntimeError: not every event was scored.

    Example::

        summary, _ = drain_backlog(settings, checkpoint, workload(settings), 5000, 4096)
    """
    with BenchTopics(settings) as topics:
        run = backlog(settings, load, events, max_batch_rows, topics)
        pipeline = bench_pipeline_of(run, checkpoint)
        return drain(pipeline, events), pipeline


def _recorded_drain(
    pipeline: ScoringPipeline, events: int, settings: Settings
) -> tuple[RunSummary, Recording, dict[str, Any]]:
    """:func:`drain` with the scorer's batches recorded and the CPU accounted per thread."""
    recording = Recording()
    pipeline.scorer = RecordingScorer(pipeline.scorer, recording)
    with CpuAccount.of_stack(settings) as account:
        summary = drain(pipeline, events)
    return summary, recording, account.result()


def bench_pipeline(
    settings: Settings,
    *,
    events: int,
    per_event_events: int,
    rounds: int,
    model_seconds: float,
    report: Callable[[str], None] = print,
    keep_topics: bool = False,
    record: Path | None = None,
    variant: Settings | None = None,
    variant_changes: tuple[str, ...] = (),
) -> PipelineBench:
    """Interleaved rounds of bare forward / batched pipeline / per-event pipeline.

    Seeds the features into Redis first (:func:`~pipeline.tools.bench.workload.workload`). Each
    end-to-end run is the pipeline ``streamrank run`` builds
    (:mod:`pipeline.tools.bench.served`); the bare forward of a round times that run's own
    scorer on this thread (the one a CPU model's forward runs on in the pipeline), before the
    run. The batched run records its batches: after it, they are replayed alone on the same
    scorer and thread (:mod:`pipeline.tools.bench.replay`); its CPU is accounted per thread and
    per process of the stack (:mod:`pipeline.tools.bench.cpu_account`).

    Args:
        settings: the stack, the model and ``batching.max_batch_rows``.
        events: events per batched end-to-end run.
        per_event_events: events per one-event-per-batch run (0 skips those runs).
        rounds: interleaved rounds.
        model_seconds: bare forward timing (and replay) per round.
        report: called with one line of progress per measurement.
        keep_topics: keep the topics of the end-to-end runs (default: deleted at the end).
        record: save the first round's recorded batches here (``bench model --replay``).
        variant: other settings (e.g. retrieval off): each round also drains the same backlog
            with them, right after the batched run (``variant_over_e2e``: interleaved pairs).
        variant_changes: what ``variant`` changes (for the report).

    Returns:
        The :class:`PipelineBench` numbers of every round.

    Example::

        bench_pipeline(settings, events=5000, per_event_events=500, rounds=3, model_seconds=3)
    """
    load = workload(settings)
    batch_rows = settings.batching.max_batch_rows
    result = PipelineBench(batch_rows=batch_rows, variant=list(variant_changes))
    with (
        bench_checkpoint(settings) as (settings, checkpoint, notes),
        BenchTopics(settings, keep_topics) as topics,
    ):
        for r in range(rounds):
            run = backlog(settings, load, events, batch_rows, topics)
            pipeline = bench_pipeline_of(run, checkpoint)
            result.pipeline = describe(pipeline, notes)
            scorer = pipeline.scorer
            bare = bench_model(scorer, load, batch_rows, model_seconds)
            result.bare_rows_per_s.append(bare.rows_per_s)
            result.bare_same_batch_rows_per_s.append(bare.same_batch_rows_per_s)
            report(
                f"round {r + 1}: bare forward {bare.rows_per_s:,.0f} rows/s over "
                f"{bare.distinct_batches} distinct batches, {bare.same_batch_rows_per_s:,.0f} "
                f"on one batch repeated ({bare.batch_rows} rows)"
            )
            summary, recording, account = _recorded_drain(pipeline, events, settings)
            result.e2e_rows_per_s.append(summary.rows_per_s)
            result.cpu_accounts.append(account)
            report(
                f"round {r + 1}: end-to-end batched {summary.rows_per_s:,.0f} rows/s; "
                f"CPU cores used: {_cores_line(account)}"
            )
            if r == 0 and record is not None:
                recording.save(record, {"model_version": scorer.model_version, **summary.as_dict()})
                report(f"recorded {len(recording.batches)} batches to {record}")
            alone = replay(scorer, recording, model_seconds).as_dict()
            result.replays.append({**recording.summary(), **alone})
            report(
                f"round {r + 1}: the drain's {len(recording.batches)} batches replayed alone: "
                f"{alone['replay_rows_per_s']:,.0f} rows/s; forward in the pipeline / alone "
                f"{alone['pipeline_over_replay']}"
            )
            if variant is not None:
                run = backlog(variant, load, events, batch_rows, topics)
                rows_per_s = drain(bench_pipeline_of(run, checkpoint), events).rows_per_s
                result.variant_rows_per_s.append(rows_per_s)
                report(f"round {r + 1}: variant {list(variant_changes)} {rows_per_s:,.0f} rows/s")
            if per_event_events:
                run = backlog(settings, load, per_event_events, 1, topics)
                rows_per_s = drain(bench_pipeline_of(run, checkpoint), per_event_events).rows_per_s
                result.per_event_rows_per_s.append(rows_per_s)
                report(f"round {r + 1}: end-to-end one event per batch {rows_per_s:,.0f} rows/s")
    return result


def _cores_line(account: dict[str, Any]) -> str:
    return ", ".join(f"{name} {cores:.2f}" for name, cores in account["cores"].items() if cores)
