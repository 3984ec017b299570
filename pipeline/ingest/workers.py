"""The rank's ingest workers: spawned, watched, stopped, and their summaries merged.

:class:`IngestWorkers` starts K worker processes (``torch.multiprocessing``, spawn: the rank has
initialised its device and threads, which a fork would copy half-way), each with its
:class:`WorkerAssignment`: its shared-memory slots and its end of a pipe
(:mod:`pipeline.ingest.transport`), its settings (its own ``transactional.id`` with
exactly-once: :func:`worker_settings`) and its share of ``--max-events``.

Lifetime (with :mod:`pipeline.jobs.lifetime`):

- a worker dies with its rank (``PR_SET_PDEATHSIG``, set first thing in the worker);
- :meth:`IngestWorkers.stop` (the rank's SIGTERM/SIGINT) passes SIGTERM on to every worker: each
  finishes its open batch, commits and exits, while the rank keeps scoring for them;
- a worker that exits non-zero (or is killed) is a failure: the others are stopped the same way,
  and the rank exits non-zero once they are done (torchrun or a supervisor restarts it; every
  uncommitted event is consumed again);
- workers still running ``shutdown.timeout_s`` + :data:`KILL_MARGIN_S` after a stop are killed.

Example::

    inputs = scorer.spec if scorer.builtin else scorer.layout
    workers = IngestWorkers(settings, rank, inputs, scorer.model_version, target, max_rows)
    workers.start()
    ...   # the scoring server serves them until workers.finished
    workers.close()
    summary = workers.summary(seconds)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from model.features.layout import InputLayout
from model.features.spec import FeatureSpec
from model.module.output import DEFAULT_OUTPUT
from model.module.types import OutputConfig
from model.rank import RankContext
from pipeline.ingest.stepping import IdleFlags
from pipeline.ingest.transport import (
    SLOTS_PER_WORKER,
    SharedSlot,
    SlotShape,
    StartConsuming,
    WorkerDone,
)
from pipeline.observability.summary import RunSummary
from pipeline.settings.loading import Settings, picklable
from pipeline.stages.commit import transactional_id

__all__ = [
    "KILL_MARGIN_S",
    "Channel",
    "IngestWorkerFailed",
    "IngestWorkers",
    "WorkerAssignment",
    "share_of",
    "worker_settings",
]

log = logging.getLogger(__name__)

KILL_MARGIN_S = 3.0
"""After a stop, workers still running ``shutdown.timeout_s`` plus this are killed (the launcher
of ``--nproc`` kills the ranks 5 s after it: the rank goes first)."""


class IngestWorkerFailed(RuntimeError):
    """An ingest worker exited non-zero or was killed: the rank exits non-zero."""


@dataclass
class WorkerAssignment:
    """Everything a spawned ingest worker needs (pickled into it).

    Attributes:
        index: 0 .. count - 1.
        count: workers of this rank.
        settings: its settings (:func:`worker_settings`).
        rank: the rank it belongs to.
        inputs: the served model's input: the built-in model's feature spec (the worker lays
            its features out with it), or a configured module's input layout.
        model_version: the served model's version at the start.
        slots: its shared-memory slots.
        conn: its end of the pipe to the server.
        parent_pid: the rank's pid (it dies with it).
        exit_when_idle_s: ``--exit-when-idle``.
        max_events: its share of ``--max-events`` (:func:`share_of`).
        setup: called first in the worker (e.g. the CLI's logging); must be picklable.
        idle: the rank's idle flags (its workers stop on idleness together).
        checkpoint: the served checkpoint directory (with ``[retrieval]`` on, the worker
            builds its retrieval index from it: the one the rank's version retrieves with).
    """

    index: int
    count: int
    settings: Settings
    rank: RankContext
    inputs: FeatureSpec | InputLayout
    model_version: str
    slots: list[SharedSlot]
    conn: Connection
    parent_pid: int
    output: OutputConfig = DEFAULT_OUTPUT
    """The served model's output config (the task columns the slots carry back)."""
    exit_when_idle_s: float | None = None
    max_events: int | None = None
    setup: Callable[[], object] | None = None
    idle: IdleFlags | None = None
    checkpoint: Path | None = None


def worker_settings(settings: Settings, rank: RankContext, index: int) -> Settings:
    """Worker ``index``'s settings: with exactly-once, a ``transactional.id`` of its own.

    Worker 0 keeps the rank's id (:func:`pipeline.stages.commit.transactional_id`), worker
    i > 0 gets ``<that>-w<i>``: distinct between the members, stable across restarts (a
    restarted worker fences its predecessor's open transaction), and the same for worker 0 as
    without workers.

    Example::

        worker_settings(settings, RankContext(), 1).delivery.transactional_id
        # "streamrank-streamrank-0-w1"
    """
    if index == 0:  # a plain Settings: it is pickled into the spawned worker
        return picklable(settings)
    tid = f"{transactional_id(settings, rank)}-w{index}"
    delivery = settings.delivery.model_copy(update={"transactional_id": tid})
    return picklable(settings, delivery=delivery)


def share_of(max_events: int | None, index: int, count: int) -> int | None:
    """Worker ``index``'s share of ``--max-events`` (the shares add up to it; ``None``: no
    limit).

    Example::

        [share_of(5, i, 2) for i in range(2)]  # [3, 2]
    """
    if max_events is None:
        return None
    return max_events // count + (1 if index < max_events % count else 0)


@dataclass
class Channel:
    """The rank's view of one worker.

    Attributes:
        index: the worker's number.
        process: its process.
        conn: the rank's end of its pipe.
        slots: its shared-memory slots.
        closed: its pipe reached end-of-file (every message it sent has been read).
        done: its summary, once it sent one.
    """

    index: int
    process: Any
    conn: Connection
    slots: list[SharedSlot]
    closed: bool = False
    done: WorkerDone | None = None
    pid: int = 0
    ready: bool = False
    """It sent :class:`~pipeline.ingest.transport.WorkerReady`."""
    started: bool = False
    """It was told to start."""

    @property
    def exited(self) -> bool:
        return self.process.exitcode is not None

    def receive(self) -> list[object]:
        """Every message waiting on the pipe (marks :attr:`closed` at end-of-file)."""
        out: list[object] = []
        try:
            while not self.closed and self.conn.poll():
                out.append(self.conn.recv())
        except (EOFError, OSError):
            self.closed = True
        return out

    def reply(self, message: object) -> None:
        """Send ``message`` to the worker (nothing when it is gone)."""
        try:
            self.conn.send(message)
        except OSError:
            self.closed = True


@dataclass
class IngestWorkers:
    """K ingest worker processes of one rank (see the module docstring).

    Args:
        settings: the rank's settings (``batching.ingest_workers`` workers).
        rank: the rank.
        inputs: the served model's feature spec (built-in) or input layout (configured).
        model_version: the served model's version.
        target: the worker's entry (a module-level function taking a
            :class:`WorkerAssignment`: :func:`pipeline.serve.serve_ingest_worker`).
        max_rows: the scorer's largest batch (its serving options' ``largest_batch_rows``),
            the slots' rows.
        setup: run first in each worker (picklable).
        exit_when_idle_s: ``--exit-when-idle`` of every worker.
        max_events: ``--max-events``, shared out (:func:`share_of`).
        checkpoint: the served checkpoint directory (the workers' retrieval index).
        output: the served model's output config (task columns in the slots).
    """

    settings: Settings
    rank: RankContext
    inputs: FeatureSpec | InputLayout
    model_version: str
    target: Callable[[WorkerAssignment], None]
    max_rows: int
    setup: Callable[[], object] | None = None
    exit_when_idle_s: float | None = None
    max_events: int | None = None
    checkpoint: Path | None = None
    output: OutputConfig = DEFAULT_OUTPUT
    channels: list[Channel] = field(default_factory=list)
    failure: str | None = None
    _deadline: float | None = None
    _stopping: bool = False

    def start(self) -> None:
        """Allocate every worker's slots and spawn the workers."""
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        count = self.settings.batching.ingest_workers
        shape = SlotShape.for_model(self.inputs, self.output, self.max_rows)
        idle = IdleFlags.allocate(count)
        for index in range(count):
            slots = [SharedSlot.allocate(shape) for _ in range(SLOTS_PER_WORKER)]
            ours, theirs = context.Pipe(duplex=True)
            assignment = WorkerAssignment(
                index=index,
                count=count,
                settings=worker_settings(self.settings, self.rank, index),
                rank=self.rank,
                inputs=self.inputs,
                model_version=self.model_version,
                slots=slots,
                conn=theirs,
                parent_pid=os.getpid(),
                output=self.output,
                exit_when_idle_s=self.exit_when_idle_s,
                max_events=share_of(self.max_events, index, count),
                setup=self.setup,
                idle=idle,
                checkpoint=self.checkpoint,
            )
            process = context.Process(
                target=self.target, args=(assignment,), name=f"ingest-worker-{index}", daemon=True
            )
            process.start()
            theirs.close()  # the worker holds its end: its exit is our end-of-file
            self.channels.append(Channel(index, process, ours, slots, pid=process.pid or 0))
            if self._stopping:
                self._signal(process.pid or 0, signal.SIGTERM)
        log.info(
            "%d ingest workers (pids %s), %d slots of %.1f MiB each",
            count,
            [c.pid for c in self.channels],
            SLOTS_PER_WORKER,
            shape.nbytes / 2**20,
        )

    @property
    def ready(self) -> bool:
        """Every worker is ready to join the group (or has exited)."""
        count = self.settings.batching.ingest_workers
        return len(self.channels) == count and all(c.ready or c.exited for c in self.channels)

    def release(self) -> None:
        """Tell every ready worker to join the consumer group now."""
        for channel in self.channels:
            if channel.ready and not channel.started:
                channel.started = True
                channel.reply(StartConsuming())

    def stop(self) -> None:
        """Ask every worker to finish its open batch, commit and exit (signal safe: only
        ``kill`` calls); the kill deadline starts now."""
        if self._deadline is None:
            self._deadline = time.monotonic() + self.settings.shutdown.timeout_s + KILL_MARGIN_S
        self._stopping = True
        for channel in self.channels:
            if not channel.exited:
                self._signal(channel.pid, signal.SIGTERM)

    @property
    def stopping(self) -> bool:
        """Whether the workers were asked to stop (a signal or a failure)."""
        return self._stopping

    @property
    def finished(self) -> bool:
        """Every worker has exited and every message it sent has been read."""
        return all(c.exited and c.closed for c in self.channels)

    def wait(self, timeout_s: float) -> list[Channel]:
        """Wait up to ``timeout_s`` for a message or an exit; the channels with messages.

        Returns:
            The channels whose pipe is readable (a message or end-of-file).
        """
        by_object: dict[Any, Channel] = {}
        for channel in self.channels:
            if not channel.closed:
                by_object[channel.conn] = channel
            if not channel.exited:
                by_object[channel.process.sentinel] = channel
        if not by_object:
            return []
        ready = wait(list(by_object), timeout_s)
        return [by_object[r] for r in ready if isinstance(r, Connection)]

    def check(self) -> None:
        """Notice exits: the first failure stops the others; past the deadline, kill."""
        for channel in self.channels:
            code = channel.process.exitcode
            if code is None or code == 0:
                continue
            if self._stopping and code == -signal.SIGTERM and self.failure is None:
                continue  # stopped before its loop started: it had taken nothing
            if self.failure is None:
                self.failure = f"ingest worker {channel.index} exited with code {code}"
                log.error("%s: stopping the other workers", self.failure)
                self.stop()
        if self._deadline is not None and time.monotonic() > self._deadline:
            alive = [c for c in self.channels if not c.exited]
            if alive:
                pids = [c.pid for c in alive]
                log.error("ingest workers %s still running after the stop: killing them", pids)
                self.failure = self.failure or f"ingest workers {pids} killed after the stop"
                for channel in alive:
                    self._signal(channel.pid, signal.SIGKILL)
                    channel.process.join(5)

    def close(self) -> None:
        """Kill what still runs, close the pipes (a worker still waiting for a reply reads
        end-of-file) and reap every worker."""
        for channel in self.channels:
            if channel.process.exitcode is None:
                self._signal(channel.pid, signal.SIGKILL)
            channel.conn.close()
        for channel in self.channels:
            channel.process.join(10)

    def summary(self, seconds: float) -> RunSummary:
        """The rank's run summary: the workers' figures merged (counts summed, busy time from
        the first input of any worker to the last output of any, latencies pooled), each
        worker's own under ``workers``.

        Args:
            seconds: how long the rank ran.
        """
        done = [c.done for c in self.channels if c.done is not None]
        merged = RunSummary(seconds=seconds)
        for part in done:
            figures = part.summary
            merged.events_in += figures["events_in"]
            merged.events_out += figures["events_out"]
            merged.dead_lettered += figures["dead_lettered"]
            merged.rows_scored += figures["rows_scored"]
            merged.batches += figures["batches"]
        starts = [d.first_input_at for d in done if d.first_input_at is not None]
        ends = [d.last_output_at for d in done if d.last_output_at is not None]
        merged.first_input_at = min(starts) if starts else None
        merged.last_output_at = max(ends) if ends else None
        for part in done:
            merged.latencies.merge(part.latencies)
        merged.workers = [
            {"worker": c.index, **c.done.summary} for c in self.channels if c.done is not None
        ]
        return merged

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        if pid <= 0:  # never a process group (kill(0, ...) would signal this one's)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
