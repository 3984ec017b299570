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
"""

from __future__ import annotations

import logging
from pathlib import Path

from model.rank import RankContext
from model.serving import ScorerFactory
from pipeline.config import Settings
from pipeline.distributed import step_stats
from pipeline.lifetime import bind_rank_to_launcher
from pipeline.loop import ScoringPipeline
from pipeline.metrics import Metrics
from pipeline.stepping import CollectiveStepper, LocalStepper, Stepper
from pipeline.summary import RunSummary

__all__ = ["serve"]

log = logging.getLogger(__name__)


def serve(
    settings: Settings,
    rank: RankContext,
    exit_when_idle_s: float | None = None,
    max_events: int | None = None,
    degradations: int = 0,
    checkpoint: Path | None = None,
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
    if settings.metrics.enabled:
        port = settings.metrics.port + rank.rank if settings.metrics.port else 0
        metrics.serve(settings.metrics.host, port)
    stepper: Stepper = LocalStepper(metrics)
    if rank.distributed:
        import torch.distributed as dist

        # The step agreement runs on the loop's thread while the forward's collectives run on
        # the scoring thread: separate groups keep their message orders apart.
        stepper = CollectiveStepper(dist.new_group(backend="gloo"), metrics=metrics)
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
