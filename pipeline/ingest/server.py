"""The scoring server: a rank's loop when ingest workers consume, decode, enrich and build the
model input (:mod:`pipeline.ingest`).

One loop on the rank's main thread (the thread that bound the device and warmed the model up):

1. **receive**: wait for a message or an exit of any worker (``multiprocessing.connection.wait``
   on the pipes and the process sentinels): score requests queue up in arrival order; metrics
   and summaries are kept (:mod:`pipeline.ingest.relay`). Before the first step every worker
   must be ready (with several ranks: every rank's, agreed in one step), then all of them are
   told to join the consumer group at once;
2. **agree**: the rank's :class:`~pipeline.runtime.stepping.Stepper` decides the step as the loop
   of one process does: alone, score whenever a request waits and stop once every worker is
   done; with several ranks of a sharded model (the
   :class:`~pipeline.runtime.stepping.ProcessGroup` transport), every rank takes part in every
   forward, padded to the largest request of the step (a rank without one joins with padding),
   and the ranks stop together when every worker of every rank is done;
3. **score**: the oldest request's slot is read in place, staged to the device
   (:meth:`~model.serving.Scorer.stage_input`), scored, and its scores written back into the
   slot (the ranking score, and every task column a configured output publishes); the worker
   is answered with the version that scored them. A forward that raises for reasons the events
   may cause is answered with the exception (the worker bisects the batch, as one process
   would); any other error stops the rank;
4. **swap** (a configured model following its versions directory, :mod:`pipeline.runtime.
   model_swap`): the step also carries this rank's offer of a loaded version; once every rank
   offers it, each one builds it at the same step (collective when sharded), warms it up on
   this thread and scores with it from the next request on. A worker's batch is one request,
   so every event of a batch is scored by one version, and the reply tells the worker which.

Example::

    server = ScoringServer(scorer, StepAgreement(metrics=metrics), merged)
    server.run(workers)   # until every worker is done
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from model.serving import Scorer
from model.serving.device import bind_thread
from pipeline.ingest.relay import MergedMetrics
from pipeline.ingest.transport import (
    MetricsReport,
    ScoreReply,
    ScoreRequest,
    WorkerDone,
    WorkerReady,
)
from pipeline.ingest.workers import Channel, IngestWorkerFailed
from pipeline.runtime.isolation import is_isolatable
from pipeline.runtime.model_swap import ModelSwap, SwapAction
from pipeline.runtime.stepping import NO_SWAP, LocalStep, StepDecision, Stepper

__all__ = ["RemoteForwardError", "ScoringServer", "WorkerPool"]

log = logging.getLogger(__name__)


class WorkerPool(Protocol):
    """What the server needs of its workers (:class:`~pipeline.ingest.workers.IngestWorkers`)."""

    failure: str | None

    @property
    def finished(self) -> bool:
        """Every worker has exited and every message it sent has been read."""
        ...

    def wait(self, timeout_s: float) -> list[Channel]:
        """The channels with messages, after waiting up to ``timeout_s`` for one."""
        ...

    def check(self) -> None:
        """Notice exits and failures; enforce the stop deadline."""
        ...

    @property
    def ready(self) -> bool:
        """Every worker is ready to join the group (or has exited)."""
        ...

    def release(self) -> None:
        """Tell every ready worker to join the group."""
        ...


class RemoteForwardError(Exception):
    """A forward failed in the scoring server with an exception that could not be pickled
    (its type and text are kept)."""


class ScoringServer:
    """Scores the ingest workers' batches (see the module docstring).

    Args:
        scorer: the rank's model (built and warmed up by :class:`~model.serving.ScorerFactory`).
        stepper: when to score (alone or agreed across ranks).
        metrics: where the workers' metrics go (``None``: not kept).
        models: follows a versions directory and swaps new versions in (``None``: the model
            never changes).
        warm_up_rows: batch sizes a swapped-in version is warmed up at (as the first one).
    """

    def __init__(
        self,
        scorer: Scorer,
        stepper: Stepper,
        metrics: MergedMetrics | None = None,
        models: ModelSwap | None = None,
        warm_up_rows: Sequence[int] = (),
    ) -> None:
        self._scorer = scorer
        self._stepper = stepper
        self._metrics = metrics
        self._models = models
        self._warm_up_rows = tuple(warm_up_rows)
        self._collective = stepper.collective
        self._keys = list(scorer.layout.keys)
        self._pending: deque[tuple[Channel, ScoreRequest]] = deque()
        self.scored = 0
        """Requests scored so far."""

    def run(self, workers: WorkerPool) -> None:
        """Serve ``workers`` until every one has exited (with several ranks: every worker of
        every rank).

        Raises:
            IngestWorkerFailed: a worker failed (raised once the others are done).
            Exception: a forward failed with an error of the device or the ranks.
        """
        bind_thread(self._scorer.device)
        self._start(workers)
        pending = self._pending
        while True:
            # receive
            for channel in workers.wait(0.0 if pending else self._stepper.poll_timeout_s):
                for message in channel.receive():
                    self._dispatch(channel, message)
            # `finished` is read before `check`: a worker that exits in between is then seen
            # by `check` (its failure raised below), never only by this step's stop.
            finished = workers.finished
            workers.check()
            if workers.failure is not None and finished:
                raise IngestWorkerFailed(workers.failure)
            # agree
            rows = pending[0][1].rows if pending else 0
            offer = self._models.offer(drained=True) if self._models is not None else NO_SWAP
            local = LocalStep(bool(pending), rows, False, finished, offer=offer)
            step = self._stepper.agree(local)
            # score
            if step.run:
                self._score(pending.popleft() if pending else None, step.rows)
            # swap
            if self._models is not None:
                self._follow(self._models, step)
            if step.stop:
                return

    @property
    def model_version(self) -> str:
        """The version serving now."""
        return self._scorer.model_version

    def _follow(self, models: ModelSwap, step: StepDecision) -> None:
        """Swap the agreed version in after this step (no forward is in flight between two
        steps; a request waiting is scored by the new version). Every rank decides the same
        from the agreed offer, so a sharded build and the warm-up are collective at one step."""
        if models.decide(step.swap, batches_empty=True) is not SwapAction.SWAP:
            return
        served = models.complete(self._stepper)
        if served is None:
            return
        start = time.perf_counter()
        try:
            served.scorer.warm_up(self._warm_up_rows)
        except Exception as exc:
            if self._collective:  # a collective warm-up failed: the ranks cannot go on apart
                raise
            models.failed(served, exc)
            return
        self._scorer = served.scorer
        models.swapped(served, warm_up_s=time.perf_counter() - start)

    def _start(self, workers: WorkerPool) -> None:
        """Wait until every worker is ready, agree with the other ranks that theirs are too
        (one step agreement: a barrier), then let all of them join the group at once."""
        while not workers.ready:
            for channel in workers.wait(self._stepper.poll_timeout_s):
                for message in channel.receive():
                    self._dispatch(channel, message)
            workers.check()
            if workers.failure is not None and workers.finished:
                raise IngestWorkerFailed(workers.failure)
        self._stepper.agree(LocalStep(False, 0, False, False))
        workers.release()

    def _dispatch(self, channel: Channel, message: object) -> None:
        if isinstance(message, ScoreRequest):
            self._pending.append((channel, message))
        elif isinstance(message, WorkerReady):
            channel.ready = True
        elif isinstance(message, MetricsReport):
            if self._metrics is not None:
                self._metrics.update(channel.index, message.families)
        elif isinstance(message, WorkerDone):
            channel.done = message
            if self._metrics is not None:
                self._metrics.update(channel.index, message.metrics)
        else:
            log.warning("ingest worker %d sent %r: ignored", channel.index, type(message))

    def _score(self, item: tuple[Channel, ScoreRequest] | None, rows: int) -> None:
        """One forward: a worker's request, or padding (ranks: this rank has none this step)."""
        scorer, pad = self._scorer, rows if self._collective else None
        if item is None or (item[0].closed and item[0].exited):
            if self._collective:  # the other ranks wait for this rank's part of the forward
                scorer.forward_padding(rows)
            return
        channel, request = item
        slot = channel.slots[request.slot]
        try:
            staged = scorer.stage_input(slot.read(request, self._keys))
            probs = scorer.forward(staged.ready_input(), pad, rows=request.rows)
            slot.scores[: request.rows].copy_(probs)
        except Exception as exc:
            if not is_isolatable(exc):
                raise
            log.warning("ingest worker %d's batch failed in the forward: %s", channel.index, exc)
            channel.reply(ScoreReply(request.slot, _portable(exc)))
            return
        self.scored += 1
        channel.reply(ScoreReply(request.slot, model_version=scorer.model_version))


def _portable(error: Exception) -> Exception:
    """``error`` if it survives pickling, else a :class:`RemoteForwardError` with its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RemoteForwardError(f"{type(error).__name__}: {error}")
    return error
