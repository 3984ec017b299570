"""Serving one process of a job: build the scorer, start the loop, report what it did.

One path for a single process and for each rank of a sharded job (``streamrank run --nproc N``
starts the ranks under torchrun: :mod:`pipeline.launch`). The model comes from one factory
(:class:`~model.serving.ScorerFactory`: device, load, shard or quantize, precision, compile,
warm-up), so both get every ``[model]`` option or refuse it in one line, and both are warm
before the consumer joins the group. With several ranks, each one also:

1. joins the process group (``cuda:{LOCAL_RANK}`` + NCCL with GPUs, else CPU + gloo), plans
   and loads its shards (inside the factory);
2. steps with the others (:class:`~pipeline.stepping.CollectiveStepper` on a gloo group of its
   own, so control traffic never syncs the GPU);
3. is a member of the Kafka consumer group, and commits its own partitions' offsets.

With ``batching.ingest_workers = K`` a process (or each rank) builds and warms up its model the
same way, then starts K worker processes (:func:`serve_ingest_worker`, each a complete loop
and consumer-group member whose forwards run here) and becomes their scoring server
(:mod:`pipeline.ingest`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from model.rank import RankContext
from model.serving import ScorerFactory
from pipeline.config import Settings
from pipeline.distributed import step_stats
from pipeline.ingest import WorkerAssignment, serve_with_workers, worker_process
from pipeline.lifetime import bind_rank_to_launcher
from pipeline.loop import ScoringPipeline
from pipeline.metrics import Metrics
from pipeline.stepping import CollectiveStepper, LocalStepper, Stepper
from pipeline.summary import RunSummary

__all__ = ["serve", "serve_ingest_worker"]

log = logging.getLogger(__name__)


def serve(
    settings: Settings,
    rank: RankContext,
    exit_when_idle_s: float | None = None,
    max_events: int | None = None,
    degradations: int = 0,
    checkpoint: Path | None = None,
    worker_setup: Callable[[], object] | None = None,
) -> tuple[RunSummary, dict[str, float]]:
    """Score until stopped (SIGTERM/SIGINT), idle, or ``max_events`` consumed.

    Args:
        settings: the configuration.
        rank: this process's place in the job.
        exit_when_idle_s: stop after this long without input (all ranks idle).
        max_events: stop after consuming this many messages.
        degradations: times the launcher restarted the job with fewer ranks.
        checkpoint: the checkpoint directory to serve (a versions directory's current version,
            resolved by the caller); default ``model.checkpoint``.
        worker_setup: with ingest workers, run first in each of them (e.g. the CLI's logging
            configuration; picklable).

    Returns:
        The run's summary and, with several ranks, this rank's step statistics
        (:func:`pipeline.distributed.step_stats`; empty alone).

    Raises:
        UnsupportedOption: a ``[model]`` option this job cannot serve.

    Example::

        summary, _ = serve(load_settings(), RankContext.from_env(), exit_when_idle_s=5)
    """
    if rank.distributed:
        bind_rank_to_launcher()  # dies with torchrun's agent and the launcher (pipeline.lifetime)
    options = settings.model.serving_options(
        settings.batching.max_batch_rows, settings.codec.max_candidates, checkpoint
    )
    scorer = ScorerFactory(options, rank).create_scorer()
    metrics = Metrics(rank=rank, degradations=degradations)
    metrics.embedding_bytes.set(scorer.embedding_bytes())
    metrics.model_info.info({"model_version": scorer.model_version})
    if degradations and rank.rank == 0:
        log.warning(
            "running on %d ranks after %d degradation(s) (streamrank_degradations)",
            rank.world_size,
            degradations,
        )
    stepper: Stepper = LocalStepper(metrics)
    if rank.distributed:
        import torch.distributed as dist

        # The step agreement runs on the loop's thread while the forward's collectives run on
        # the scoring thread: separate groups keep their message orders apart.
        stepper = CollectiveStepper(dist.new_group(backend="gloo"), metrics=metrics)
    if settings.batching.ingest_workers:
        try:
            summary = serve_with_workers(
                settings,
                rank,
                scorer,
                metrics,
                stepper,
                serve_ingest_worker,
                exit_when_idle_s,
                max_events,
                worker_setup,
            )
            return summary, step_stats(metrics) if rank.distributed else {}
        finally:
            if rank.distributed:
                import torch.distributed as dist

                dist.destroy_process_group()
    if settings.metrics.enabled:
        port = settings.metrics.port + rank.rank if settings.metrics.port else 0
        metrics.serve(settings.metrics.host, port)
    pipeline = ScoringPipeline(settings, scorer, metrics, stepper=stepper, rank=rank)
    pipeline.stop_on_signals()
    log.info(
        "scoring %s -> %s (dlq %s) with model %s",
        settings.topics.input,
        settings.topics.output,
        settings.topics.dlq,
        scorer.model_version,
    )
    try:
        summary = pipeline.run(exit_when_idle_s=exit_when_idle_s, max_events=max_events)
        return summary, step_stats(metrics) if rank.distributed else {}
    finally:
        if rank.distributed:
            import torch.distributed as dist

            dist.destroy_process_group()


def serve_ingest_worker(assignment: WorkerAssignment) -> None:
    """An ingest worker's process (spawned by its rank): a complete consumer-group member whose
    forwards run in the rank (:mod:`pipeline.ingest`).

    Args:
        assignment: what the rank gave it (settings, slots, pipe, share of ``--max-events``).

    Example::

        # spawned by pipeline.ingest.IngestWorkers, never called directly
        serve_ingest_worker(assignment)
    """
    with worker_process(assignment) as worker:
        pipeline = ScoringPipeline(
            worker.settings,
            worker.scorer,
            worker.metrics,
            stepper=worker.stepper,
            rank=assignment.rank,
        )
        pipeline.stop_on_signals()
        summary = pipeline.run(
            exit_when_idle_s=assignment.exit_when_idle_s, max_events=assignment.max_events
        )
        worker.finish(summary)
