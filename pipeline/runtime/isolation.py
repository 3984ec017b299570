"""Poison isolation: find the events a failing batch step chokes on, by bisection.

When a step after decode (enrich, features, forward, top-K, encode) raises for a batch, the
batch is split in halves and each half is retried, recursively, until the failing events stand
alone. Those are dead-lettered with reason ``processing_error``; the rest are scored. One
poison event among ``n`` costs about ``2 log2 n`` extra attempts, paid only when a batch fails.

Not every exception is a poison event: an error of the environment (the broker, a delivery,
memory, the operating system, the GPU, the ranks' communication) says nothing about the events,
so :func:`is_isolatable` refuses those and they propagate: the process stops uncommitted and a
restart (torchrun's, or the supervisor's) scores the batch again on a fresh device context.

:class:`PoisonIsolation` applies :func:`bisect` to the steps of a batch
(:class:`~pipeline.runtime.steps.BatchSteps`) for the processor
(:mod:`pipeline.runtime.processor`), in three ways:

- **alone** (a single process): the whole path is retried on each part, on the loop's thread;
- **before the forward** (a rank of a sharded model): the local steps (enrich, features) are
  bisected alone; the good events join the agreed forward;
- **together** (a rank's batch failed after the collective forward: its local compute, top-K,
  encode): every rank bisects in lockstep, each attempt one collective forward that the other
  ranks join with padding (:class:`~pipeline.runtime.stepping.IsolationRounds`), so a poison
  event never crashes the ranks. An exception raised before a rank's part of a collective is not
  recoverable this way (the others wait in the collective): like device and communication
  errors, it stops the ranks uncommitted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from pipeline.connectors.kafka.errors import KafkaClientError
from pipeline.observability.summary import RunSummary
from pipeline.runtime.stepping import IsolationRounds
from pipeline.runtime.steps import BatchSteps
from pipeline.stages.dead_letter import DeadLetterSink
from pipeline.stages.score import ForwardExecutor, ForwardFailed
from pipeline.types import Batch, DeliveryFailed, PreparedBatch, RejectedMessage, RejectReason

log = logging.getLogger(__name__)

T = TypeVar("T")
E = TypeVar("E")

_ENVIRONMENT_ERRORS: tuple[type[BaseException], ...] = (
    DeliveryFailed,
    KafkaClientError,
    BufferError,
    MemoryError,
    OSError,
    torch.cuda.OutOfMemoryError,
    torch.AcceleratorError,  # a CUDA error: the device context is broken, not the events
    dist.DistError,  # NCCL/gloo/store failures of the ranks' collectives
)


def is_isolatable(exc: BaseException) -> bool:
    """Whether ``exc`` may be caused by the events of the batch (and so worth bisecting).

    Example::

        is_isolatable(ValueError("bad value"))  # True
        is_isolatable(DeliveryFailed("broker down"))  # False
    """
    return isinstance(exc, Exception) and not isinstance(exc, _ENVIRONMENT_ERRORS)


@dataclass
class Isolation(Generic[E, T]):
    """What bisection found.

    Attributes:
        good: groups of events whose attempt succeeded, with its result (in input order).
        failed: each event that fails alone, with the exception it raised.
        attempts: attempts made (the initial failure not counted).
    """

    good: list[tuple[list[E], T]] = field(default_factory=list)
    failed: list[tuple[E, Exception]] = field(default_factory=list)
    attempts: int = 0

    @property
    def good_items(self) -> list[E]:
        """Every event of the good groups, in input order."""
        return [item for group, _ in self.good for item in group]


def bisect(
    records: list[E],
    attempt: Callable[[list[E]], T],
    first_error: Exception,
) -> Isolation[E, T]:
    """Split a failed batch until every failing event stands alone.

    Args:
        records: the batch's events (e.g. their indices), whose attempt already raised
            ``first_error``.
        attempt: processes a group of events; raises if it cannot. It must have no effect
            when it raises (or only effects that are harmless to repeat).
        first_error: what the whole batch raised.

    Returns:
        The good groups with their results, and the failing records with their errors.

    Raises:
        Exception: an attempt raised an error :func:`is_isolatable` refuses (an outage, not
            an event): it propagates.

    Example::

        found = bisect(records, lambda group: prepare(group), first_error=exc)
        for record, error in found.failed:
            dead_letter(record, error)
    """
    found: Isolation[E, T] = Isolation()

    def split(group: list[E], error: Exception) -> None:
        if len(group) == 1:
            found.failed.append((group[0], error))
            return
        middle = len(group) // 2
        for half in (group[:middle], group[middle:]):
            found.attempts += 1
            try:
                result = attempt(half)
            except Exception as exc:
                if not is_isolatable(exc):
                    raise
                split(half, exc)
            else:
                found.good.append((half, result))

    split(records, first_error)
    return found


class PoisonIsolation:
    """Bisects the failed batches of one processor (see the module docstring).

    Args:
        steps: the batch's steps, retried on parts of it.
        executor: the scoring thread (collective attempts run their forward there).
        dead_letters: where an event that fails alone goes (``processing_error``).
        summary: counts the dead letters.

    Example::

        isolation = PoisonIsolation(steps, executor, dead_letters, summary)
        isolation.alone(batch, error)  # dead-letters the poison events, scores the rest
    """

    def __init__(
        self,
        steps: BatchSteps,
        executor: ForwardExecutor,
        dead_letters: DeadLetterSink,
        summary: RunSummary,
    ) -> None:
        self._steps = steps
        self._executor = executor
        self._dead_letters = dead_letters
        self._summary = summary
        self._held: list[tuple[Batch, Exception]] = []
        """Ranks of a sharded model: batches whose collective forward went through but whose
        scoring failed, waiting for :meth:`together`."""

    def alone(self, batch: Batch, error: Exception) -> None:
        """Bisect the whole path on this thread: dead-letter the events that fail alone, score
        the rest, seal the checkpoint (single process)."""
        log.warning("batch of %d events failed (%s): isolating", batch.events.num_events, error)
        found = bisect(
            list(range(batch.events.num_events)), lambda g: self._steps.run(_take(batch, g)), error
        )
        self._dead_letter(batch, found.failed)
        batch.checkpoint.seal()

    def before_forward(self, batch: Batch, error: Exception) -> PreparedBatch | None:
        """Ranks of a sharded model: bisect the local steps before the forward, dead-letter the
        events that fail alone; the good ones join the agreed forward (``None``: none left)."""
        log.warning("batch of %d events failed (%s): isolating", batch.events.num_events, error)
        indices = list(range(batch.events.num_events))
        found = bisect(indices, lambda g: self._steps.prepare(_take(batch, g)), error)
        self._dead_letter(batch, found.failed)
        good = found.good_items
        if good:
            return self._steps.prepare(_take(batch, good))
        batch.checkpoint.seal()
        return None

    def hold(self, batch: Batch, error: Exception) -> None:
        """A rank's batch failed after the collective forward: bisected at the next step, with
        every rank (:meth:`together`)."""
        log.warning("batch failed after the collective forward (%s)", error)
        self._held.append((batch, error))

    def drop(self) -> int:
        """Forget the held batches (their transaction was aborted). Returns their events."""
        held, self._held = self._held, []
        return sum(batch.events.num_events for batch, _ in held)

    @property
    def waiting(self) -> bool:
        """Whether a batch of this rank waits to be bisected by all ranks together."""
        return bool(self._held)

    def together(self, rounds: IsolationRounds) -> None:
        """Every rank of a sharded model, in lockstep (nothing in flight): bisect this rank's
        held batches, each attempt one collective forward that the other ranks join with
        padding, until no rank has anything left to try. Events that fail alone are
        dead-lettered.

        Args:
            rounds: agrees, per attempt, whether some rank still needs one and the rows to pad
                to (:meth:`pipeline.runtime.stepping.StepAgreement.agree_attempt`).
        """
        held, self._held = self._held, []
        for batch, error in held:
            log.warning("bisecting a batch of %d events with every rank", batch.events.num_events)

            def attempt(group: list[int], batch: Batch = batch) -> None:
                prepared = self._steps.prepare(_take(batch, group))  # local: may fail alone
                pad = rounds.agree_attempt(prepared.batch.events.num_rows)
                self._executor.start(prepared, pad)
                done = self._executor.take(wait=True)
                if done is not None:
                    self._steps.publish(done[0], self._steps.encode(*done))

            found = bisect(list(range(batch.events.num_events)), _unwrapped(attempt), error)
            self._dead_letter(batch, found.failed)
            batch.checkpoint.seal()
        while (pad := rounds.agree_attempt(None)) is not None:
            self._executor.start(None, pad)  # another rank's attempt: join it with padding
            self._executor.take(wait=True)

    def _dead_letter(self, batch: Batch, failed: list[tuple[int, Exception]]) -> None:
        for index, exc in failed:
            rejection = RejectedMessage(
                RejectReason.PROCESSING_ERROR, f"{type(exc).__name__}: {exc}"
            )
            self._dead_letters.publish(batch.messages.message(index), rejection, batch.checkpoint)
            self._summary.dead_lettered += 1


def _take(batch: Batch, group: list[int]) -> Batch:
    return batch.take(np.asarray(group, dtype=np.int64))


def _unwrapped(attempt: Callable[[list[int]], None]) -> Callable[[list[int]], None]:
    """``attempt`` raising the forward's own error instead of :class:`ForwardFailed`."""

    def run(group: list[int]) -> None:
        try:
            attempt(group)
        except ForwardFailed as failed:
            raise failed.error from None

    return run
