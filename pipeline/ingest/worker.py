"""An ingest worker's process: what surrounds its loop.

The loop itself (a complete :class:`~pipeline.runtime.loop.ScoringPipeline`: its own consumer in the
rank's consumer group, its own producer and commits) is built by the serving entry,
:func:`pipeline.serve.serve_ingest_worker`, inside :func:`worker_process`, which:

1. binds the worker's life to its rank (``PR_SET_PDEATHSIG``: :func:`pipeline.jobs.lifetime.
   die_with_parent`);
2. runs the assignment's ``setup`` (the CLI's logging) and labels the worker's log records
   ``[w<index>]``;
3. keeps torch to one intra-op thread (K workers share the host's cores; the forward is not
   here);
4. gives the loop a :class:`~pipeline.ingest.remote_scorer.RemoteScorer` and a metrics registry
   relayed to the rank (:class:`~pipeline.ingest.relay.MetricsRelay`), once every worker of the
   rank is ready (they join the consumer group together: within the broker's
   ``group.initial.rebalance.delay.ms``, 3 s by default, the first assignment is over all of
   them; a broker without that delay, as the test stack's, may give the first one every
   partition and move half of them to the second in a cooperative rebalance);
5. at the end sends the run summary (:class:`~pipeline.ingest.transport.WorkerDone`) and ends
   the process without the interpreter's teardown; a failure is logged as one record and the
   process exits 1.

Example::

    def serve_ingest_worker(assignment: WorkerAssignment) -> None:
        with worker_process(assignment) as worker:
            pipeline = ScoringPipeline(worker.settings, worker.scorer, worker.metrics, rank=...)
            worker.finish(pipeline.run(...))
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

import torch

from pipeline.ingest.relay import MetricsRelay, snapshot
from pipeline.ingest.remote_scorer import RemoteScorer
from pipeline.ingest.stepping import IdleFlags, WorkerStepper
from pipeline.ingest.transport import WorkerDone, WorkerLink
from pipeline.ingest.workers import WorkerAssignment
from pipeline.jobs.lifetime import die_with_parent
from pipeline.models.loader import ModelLoader
from pipeline.observability.metrics import Metrics
from pipeline.observability.summary import RunSummary
from pipeline.settings.loading import Settings

if TYPE_CHECKING:
    from model.features.mapping import FeatureMap
    from model.retrieval.index import VectorIndex
    from pipeline.models.output import OutputContract

__all__ = ["WorkerRuntime", "worker_process"]

log = logging.getLogger(__name__)


class _WorkerLabel(logging.Filter):
    """Appends ``[w<index>]`` to the logger name of every record of this worker."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.suffix = f"[w{index}]"

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.endswith(self.suffix):
            record.name = f"{record.name}{self.suffix}"
        return True


@dataclass
class WorkerRuntime:
    """What the worker's loop is built from.

    Attributes:
        assignment: what the rank gave this worker.
        settings: its settings (its own ``transactional.id`` with exactly-once).
        scorer: the remote scorer.
        metrics: its metrics (relayed to the rank's endpoint).
        link: its pipe to the server.
        relay: sends its metrics.
        stepper: its loop's stepper (stops on idleness with the other workers).
        index: the served version's retrieval index (``None``: retrieval off, or an empty
            catalogue).
        feature_map: a configured model's feature map, when the worker resolved it for its
            retrieval index (its loop then takes it as it is); ``None``: the loop resolves it.
        output: the configured model's output contract, resolved with its feature map;
            ``None``: the loop resolves it.
    """

    assignment: WorkerAssignment
    settings: Settings
    scorer: RemoteScorer
    metrics: Metrics
    link: WorkerLink
    relay: MetricsRelay
    stepper: WorkerStepper
    index: VectorIndex | None = None
    feature_map: FeatureMap | None = None
    output: OutputContract | None = None

    def finish(self, summary: RunSummary) -> None:
        """Send the run's summary and final metrics to the rank (the last message)."""
        self.relay.stop()
        self.link.send(
            WorkerDone(
                summary=summary.as_dict(),
                latencies=summary.latencies,
                first_input_at=summary.first_input_at,
                last_output_at=summary.last_output_at,
                metrics=snapshot(self.metrics.registry),
            )
        )


@contextmanager
def worker_process(assignment: WorkerAssignment) -> Iterator[WorkerRuntime]:
    """Set up an ingest worker's process around its loop (see the module docstring).

    Args:
        assignment: what the rank gave this worker.

    Yields:
        The runtime to build the loop from.

    The process ends when the ``with`` block does: exit status 0, or 1 when the loop raised
    (logged first as one record).
    """
    die_with_parent(assignment.parent_pid)
    # Ctrl-C reaches every process of a terminal's group: until its loop handles signals, a
    # worker leaves SIGINT to its rank, which passes a SIGTERM on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if assignment.setup is not None:
        assignment.setup()
    label = _WorkerLabel(assignment.index)
    for handler in logging.getLogger().handlers:
        handler.addFilter(label)
    torch.set_num_threads(1)
    link = WorkerLink(assignment.conn)
    metrics = Metrics(rank=assignment.rank)
    relay = MetricsRelay(metrics.registry, link.send)
    scorer = RemoteScorer(
        link, assignment.slots, assignment.inputs, assignment.model_version, assignment.output
    )
    idle = assignment.idle or IdleFlags.allocate(assignment.count)
    stepper = WorkerStepper(idle, assignment.index, metrics)
    runtime = WorkerRuntime(assignment, assignment.settings, scorer, metrics, link, relay, stepper)
    log.info(
        "ingest worker %d of %d (pid %d) ready to join group %s",
        assignment.index,
        assignment.count,
        os.getpid(),
        assignment.settings.kafka.group_id,
    )
    relay.start()
    try:
        if assignment.checkpoint is not None:  # before it is ready: it retrieves from its start
            indexed = ModelLoader(assignment.settings, assignment.rank).load_index(
                assignment.checkpoint
            )
            runtime.index = indexed.index
            configured = indexed.configured  # resolved once: the loop takes its map, contract
            if configured is not None:
                runtime.feature_map, runtime.output = configured.fmap, configured.output
        link.wait_for_start()
        yield runtime
    except BaseException as exc:
        relay.stop()
        log.critical("ingest worker %d failed: %r", assignment.index, exc, exc_info=exc)
        _leave(stepper, link, 1)
    _leave(stepper, link, 0)


def _leave(stepper: WorkerStepper, link: WorkerLink, code: int) -> NoReturn:
    """End the worker's process now: its clients are closed and its records flushed (or left
    uncommitted), its summary sent; the interpreter's teardown (seconds for torch, numba and
    librdkafka on a busy host, during which the rank waits) is skipped, as a rank's is."""
    stepper.leave()
    link.close()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
