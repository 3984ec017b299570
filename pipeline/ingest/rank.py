"""A rank with ingest workers: warm the model up, start the workers, serve them, merge their
summaries (called by :func:`pipeline.serve.serve` when ``batching.ingest_workers > 0``).

Example::

    summary = serve_with_workers(settings, rank, scorer, metrics, stepper, serve_ingest_worker,
                                 max_rows=served.options.largest_batch_rows)
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from model.rank import RankContext
from model.serving import Scorer
from model.serving.device import bind_thread
from pipeline.ingest.relay import MergedMetrics
from pipeline.ingest.server import ScoringServer
from pipeline.ingest.workers import IngestWorkers, WorkerAssignment
from pipeline.observability.metrics import Metrics
from pipeline.observability.summary import RunSummary
from pipeline.runtime.model_swap import ModelSwap
from pipeline.runtime.stepping import Stepper
from pipeline.settings.loading import Settings

__all__ = ["serve_with_workers"]

log = logging.getLogger(__name__)


def serve_with_workers(
    settings: Settings,
    rank: RankContext,
    scorer: Scorer,
    metrics: Metrics,
    stepper: Stepper,
    target: Callable[[WorkerAssignment], None],
    max_rows: int,
    exit_when_idle_s: float | None = None,
    max_events: int | None = None,
    setup: Callable[[], object] | None = None,
    checkpoint: Path | None = None,
    models: ModelSwap | None = None,
    metrics_port: int | None = None,
) -> RunSummary:
    """Serve ``batching.ingest_workers`` workers until all of them are done.

    The model is warmed up on this thread (the one that scores) before any worker joins the
    consumer group; SIGTERM/SIGINT are passed on to the workers (each finishes its open batch
    and commits, served meanwhile); the rank's metrics endpoint serves the workers' metrics too.

    Args:
        settings: the rank's settings.
        rank: the rank.
        scorer: its model.
        metrics: its metrics (the workers' are merged in: :mod:`pipeline.ingest.relay`).
        stepper: when to score (agreed across ranks with several).
        target: the workers' entry (:func:`pipeline.serve.serve_ingest_worker`).
        max_rows: the scorer's largest batch (``largest_batch_rows`` of the serving options it
            was built with: :attr:`pipeline.models.loader.ServedModel.options`), the size of
            the workers' slots.
        exit_when_idle_s: each worker stops after this long without input.
        max_events: shared out over the workers (never more in all).
        setup: run first in every worker (the CLI's logging; picklable).
        checkpoint: the served checkpoint directory (with ``[retrieval]`` on, each worker
            builds its retrieval index from it).
        models: follows a versions directory: this process swaps promoted versions in
            between two forwards (a configured model: its workers' input does not depend on
            the version).
        metrics_port: where the rank's metrics endpoint serves its own and its workers'
            metrics (``settings.metrics.port_for(rank)``); ``None``: no endpoint.

    Returns:
        The rank's summary: its workers' merged, each worker's under ``workers``.

    Raises:
        IngestWorkerFailed: a worker failed (after the others stopped).

    Example::

        summary = serve_with_workers(settings, RankContext(), scorer, Metrics(),
                                     StepAgreement(), serve_ingest_worker, max_rows=4096,
                                     exit_when_idle_s=5)
    """
    merged = MergedMetrics(metrics.registry)
    if metrics_port is not None:
        metrics.serve(settings.metrics.host, metrics_port, registry=merged.registry)
    bind_thread(scorer.device)
    warm_up_rows = settings.batching.warm_up_rows
    scorer.warm_up(warm_up_rows)  # collective with several ranks
    workers = IngestWorkers(
        settings,
        rank,
        scorer.spec if scorer.builtin else scorer.layout,
        scorer.model_version,
        target,
        max_rows,
        setup=setup,
        exit_when_idle_s=exit_when_idle_s,
        max_events=max_events,
        checkpoint=checkpoint,
        output=scorer.output,
    )

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: the ingest workers finish their open batches and commit", signum)
        workers.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = ScoringServer(scorer, stepper, merged, models, warm_up_rows)
    started = time.monotonic()
    try:
        workers.start()
        if models is not None:
            models.start()
        server.run(workers)
    finally:
        if models is not None:
            models.stop()
        metrics.set_up(False)
        workers.close()
    log.info("scored %d batches of %d ingest workers", server.scored, len(workers.channels))
    return workers.summary(time.monotonic() - started)
