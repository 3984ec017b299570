"""Serving one process of a job: build the scorer, start the loop, report what it did.

One path for a single process and for each rank of a sharded job (``streamrank run --nproc N``
starts the ranks under torchrun: :mod:`pipeline.jobs.launch`). The model comes from one loader
(:class:`~pipeline.models.loader.ModelLoader`: the one :class:`~model.serving.ScorerFactory`
for device, load, shard or quantize, precision, compile; and the retrieval index), so both get
every ``[model]`` option or refuse it in one line, and both are warm before the consumer joins
the group. A versions directory is followed while serving (:mod:`pipeline.runtime.model_swap`). With
several ranks, each one also:

1. joins the process group (``cuda:{LOCAL_RANK}`` + NCCL with GPUs, else CPU + gloo), plans
   and loads its shards (inside the factory);
2. steps with the others (:class:`~pipeline.runtime.stepping.ProcessGroup`, a gloo group of its
   own, so control traffic never syncs the GPU);
3. is a member of the Kafka consumer group, and commits its own partitions' offsets.

With ``batching.ingest_workers = K`` a process (or each rank) loads and warms up its model the
same way, then starts K worker processes (:func:`serve_ingest_worker`, each a complete loop
and consumer-group member whose forwards run here) and becomes their scoring server
(:mod:`pipeline.ingest`). With a configured model (``[model.module]``) the scoring server
follows a versions directory as the loop does; the built-in model (whose versions may change
the feature spec the workers lay their input out with) and retrieval (an index in every
worker) serve one version (refused with a versions directory to follow when the
:class:`~pipeline.settings.loading.Settings` are validated).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from model.rank import RankContext
from model.serving import Scorer
from model.store.versions import is_versions_dir, resolve_checkpoint
from pipeline.connectors.kafka.clients import ClientFactory, connect
from pipeline.ingest import WorkerAssignment, serve_with_workers, worker_process
from pipeline.jobs.lifetime import bind_rank_to_launcher
from pipeline.jobs.summaries import step_stats
from pipeline.models.loader import ModelLoader
from pipeline.models.watch import MetricsSwapObserver, ModelWatcher
from pipeline.observability.metrics import Metrics
from pipeline.observability.summary import RunSummary
from pipeline.runtime.loop import ScoringPipeline
from pipeline.runtime.model_swap import ModelSwap
from pipeline.runtime.stepping import ProcessGroup, StepAgreement, Stepper
from pipeline.settings.loading import Settings
from pipeline.stages.enrich.enricher import BatchEnricher

if TYPE_CHECKING:
    from pipeline.models.output import OutputContract
    from pipeline.models.preflight import ConfiguredModel

__all__ = ["build_pipeline", "serve", "serve_ingest_worker"]

log = logging.getLogger(__name__)


def serve(
    settings: Settings,
    rank: RankContext,
    exit_when_idle_s: float | None = None,
    max_events: int | None = None,
    degradations: int = 0,
    checkpoint: Path | None = None,
    worker_setup: Callable[[], object] | None = None,
    configured: ConfiguredModel | None = None,
    output: OutputContract | None = None,
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
        configured: ``[model.module]`` as the start-up checks of this process resolved it
            (:func:`pipeline.models.preflight.check_configured_model`); default: resolved by
            the loader.
        output: the built-in model's output contract as the start-up checks of this process
            resolved it (:func:`pipeline.cli.checks.require_builtin_model`; a configured
            model's comes with ``configured``); default: resolved by the loop (by each ingest
            worker's, in its own process).

    Returns:
        The run's summary and, with several ranks, this rank's step statistics
        (:func:`pipeline.jobs.summaries.step_stats`; empty alone).

    Raises:
        UnsupportedOption: a ``[model]`` option this job cannot serve.

    Example::

        summary, _ = serve(load_settings(), RankContext.from_env(), exit_when_idle_s=5)
    """
    if rank.distributed:
        # dies with torchrun's agent and the launcher (pipeline.jobs.lifetime)
        bind_rank_to_launcher()
    metrics = Metrics(rank=rank, degradations=degradations)
    if degradations and rank.rank == 0:
        log.warning(
            "running on %d ranks after %d degradation(s) (streamrank_degradations)",
            rank.world_size,
            degradations,
        )
    metrics_port = settings.metrics.port_for(rank.rank) if settings.metrics.enabled else None
    topics = settings.topics
    try:
        if settings.batching.ingest_workers:
            followed = _versions_followed(settings, checkpoint)
            loader = ModelLoader(settings, rank, configured=configured)
            served = loader.load(checkpoint or settings.model.checkpoint)
            _model_metrics(metrics, served.scorer)
            summary = serve_with_workers(
                settings,
                rank,
                served.scorer,
                metrics,
                _stepper(rank, metrics),
                serve_ingest_worker,
                served.options.largest_batch_rows,
                exit_when_idle_s,
                max_events,
                worker_setup,
                checkpoint=checkpoint or settings.model.checkpoint,
                models=_model_swap(followed, loader, metrics),
                metrics_port=metrics_port,
            )
            return summary, step_stats(metrics) if rank.distributed else {}
        pipeline = build_pipeline(
            settings, rank, metrics, checkpoint, configured=configured, output=output
        )
        if metrics_port is not None:
            metrics.serve(settings.metrics.host, metrics_port)
        pipeline.stop_on_signals()
        log.info(
            "scoring %s -> %s (dlq %s) with model %s",
            topics.input,
            topics.output,
            topics.dlq,
            pipeline.scorer.model_version,
        )
        summary = pipeline.run(exit_when_idle_s=exit_when_idle_s, max_events=max_events)
        return summary, step_stats(metrics) if rank.distributed else {}
    finally:
        if rank.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def build_pipeline(
    settings: Settings,
    rank: RankContext,
    metrics: Metrics,
    checkpoint: Path | None = None,
    enricher: BatchEnricher | None = None,
    clients: ClientFactory = connect,
    configured: ConfiguredModel | None = None,
    output: OutputContract | None = None,
) -> ScoringPipeline:
    """The scoring loop of this process, its model version loaded (collective with ranks).

    The model (scorer and retrieval index) comes from :class:`~pipeline.models.loader.
    ModelLoader`, the same loader that loads later versions; with ``model_swap.enabled`` and
    ``model.checkpoint`` a versions directory, the pipeline follows its current version
    (:mod:`pipeline.runtime.model_swap`).

    Args:
        settings: the configuration.
        rank: this process's place in the job.
        metrics: the process's metrics.
        checkpoint: the checkpoint directory to serve (default ``model.checkpoint``).
        enricher: the feature source (default: Redis as configured).
        clients: builds the Kafka clients (default: the configured broker).
        configured: ``[model.module]`` resolved (default: by the loader).
        output: the built-in model's output contract, resolved (default: by the loop; a
            configured model's comes with the loaded model).

    Returns:
        The pipeline, ready to :meth:`~pipeline.runtime.loop.ScoringPipeline.run`.

    Example::

        pipeline = build_pipeline(settings, RankContext(), Metrics())
    """
    followed = _versions_followed(settings, checkpoint)
    loader = ModelLoader(settings, rank, configured=configured)
    served = loader.load(checkpoint or settings.model.checkpoint)
    _model_metrics(metrics, served.scorer)
    resolved = served.configured
    return ScoringPipeline(
        settings,
        served.scorer,
        metrics,
        enricher=enricher,
        stepper=_stepper(rank, metrics),
        rank=rank,
        clients=clients,
        index=served.index,
        models=_model_swap(followed, loader, metrics),
        feature_map=resolved.fmap if resolved is not None else None,
        output=resolved.output if resolved is not None else output,
    )


@dataclass(frozen=True)
class VersionsFollowed:
    """The versions directory a process follows while serving (read from the settings before
    the model loads; :func:`_model_swap` acts on it once the loader is ready)."""

    root: Path
    served: Path
    poll_interval_s: float


def _versions_followed(settings: Settings, checkpoint: Path | None) -> VersionsFollowed | None:
    """``model.checkpoint`` when it is a versions directory to follow (``model_swap``)."""
    root = settings.model.checkpoint
    if not settings.model_swap.enabled or not is_versions_dir(root):
        return None
    served = checkpoint or resolve_checkpoint(root)
    return VersionsFollowed(root, served, settings.model_swap.poll_interval_s)


def _model_swap(
    followed: VersionsFollowed | None, loader: ModelLoader, metrics: Metrics
) -> ModelSwap | None:
    """A :class:`ModelSwap` watching ``followed`` (none without it)."""
    if followed is None:
        return None
    watcher = ModelWatcher(
        followed.root,
        loader.load_local,
        followed.served.name,
        poll_interval_s=followed.poll_interval_s,
        observer=MetricsSwapObserver(metrics),
    )
    log.info("following the model versions of %s (serving %s)", followed.root, followed.served.name)
    return ModelSwap(watcher, loader, metrics)


def serve_ingest_worker(assignment: WorkerAssignment) -> None:
    """An ingest worker's process (spawned by its rank): a complete consumer-group member whose
    forwards run in the rank (:mod:`pipeline.ingest`).

    Args:
        assignment: what the rank gave it (settings, slots, pipe, share of ``--max-events``,
            the retrieval index's checkpoint).

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
            index=worker.index,
            feature_map=worker.feature_map,
            output=worker.output,
        )
        pipeline.stop_on_signals()
        summary = pipeline.run(
            exit_when_idle_s=assignment.exit_when_idle_s, max_events=assignment.max_events
        )
        worker.finish(summary)


def _model_metrics(metrics: Metrics, scorer: Scorer) -> None:
    """The served model's figures: its embedding bytes and version."""
    metrics.embedding_bytes.set(scorer.embedding_bytes())
    metrics.model_info.info({"model_version": scorer.model_version})


def _stepper(rank: RankContext, metrics: Metrics) -> Stepper:
    """When to score: alone, or agreed with the other ranks."""
    if not rank.distributed:
        return StepAgreement(metrics=metrics)
    import torch.distributed as dist

    # The step agreement runs on the loop's thread while the forward's collectives run on the
    # scoring thread: separate groups keep their message orders apart.
    return StepAgreement(ProcessGroup(dist.new_group(backend="gloo")), metrics)
