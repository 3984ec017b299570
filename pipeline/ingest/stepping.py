"""When an ingest worker stops on idleness, and leaves its group: together with the workers of
its rank.

A worker's loop decides its steps alone (its forwards are its own requests; the rank's server
does the collective part with other ranks), but ``--exit-when-idle`` means the same as for the
ranks of a sharded job: stop once *all* are idle. One worker alone may look idle while the group
is still moving partitions to it (the cooperative protocol assigns a newcomer nothing in its
first round and its partitions in a second one); if it left then, its partitions would wait for
the next rebalance while it exits. So each worker publishes whether it is idle in a flag of a
small shared array (:class:`IdleFlags`), and its stepper (the one
:class:`~pipeline.runtime.stepping.StepAgreement`, stepping alone, with the rank's other workers
as its :class:`~pipeline.runtime.stepping.Peers`) stops on idleness only when every flag is up.
Likewise a worker that drains leaves the group only once every other worker that drains has
committed (the drain's barrier, :meth:`~pipeline.runtime.stepping.StepAgreement.all_drained`;
a worker still running is not waited for). A worker that has exited keeps its flags up.

Example::

    flags = IdleFlags.allocate(2)                        # in the rank
    stepper = WorkerStepper(flags, index=0, metrics=m)   # in worker 0
    ScoringPipeline(settings, scorer, m, stepper=stepper).run(exit_when_idle_s=5)
"""

from __future__ import annotations

import torch

from pipeline.observability.metrics import Metrics
from pipeline.runtime.stepping import Alone, StepAgreement

__all__ = ["IdleFlags", "WorkerStepper"]

_IDLE, _DRAINING, _DRAINED = 0, 1, 2


class IdleFlags:
    """Flags per worker of a rank, in shared memory: whether that worker is idle, whether it
    drains, and whether its drain has ended.

    Args:
        flags: int8[3, K], shared (:meth:`allocate`).
    """

    def __init__(self, flags: torch.Tensor) -> None:
        self.flags = flags

    @classmethod
    def allocate(cls, count: int) -> IdleFlags:
        """Flags for ``count`` workers, all down (passed to the spawned workers)."""
        return cls(torch.zeros(3, count, dtype=torch.int8).share_memory_())

    def set(self, index: int, idle: bool) -> None:
        """Worker ``index`` is idle now (or not)."""
        self.flags[_IDLE, index] = int(idle)

    @property
    def all_idle(self) -> bool:
        """Every worker is idle (or has exited)."""
        return bool(self.flags[_IDLE].all())

    def drained(self, index: int, done: bool) -> bool:
        """Worker ``index`` drains (``done``: its drain has ended): whether every worker that
        drains has ended its drain."""
        self.flags[_DRAINING, index] = 1
        self.flags[_DRAINED, index] = int(done)
        draining, drained = self.flags[_DRAINING].bool(), self.flags[_DRAINED].bool()
        return bool((drained | ~draining).all())

    def leave(self, index: int) -> None:
        """Worker ``index`` is done: it no longer holds the others back."""
        self.flags[:, index] = 1


class _Seat:
    """One worker's place among its rank's workers (:class:`~pipeline.runtime.stepping.Peers`)."""

    def __init__(self, flags: IdleFlags, index: int) -> None:
        self._flags = flags
        self._index = index

    def all_idle(self, idle: bool) -> bool:
        self._flags.set(self._index, idle)
        return self._flags.all_idle

    def all_drained(self, done: bool) -> bool:
        return self._flags.drained(self._index, done)

    def leave(self) -> None:
        self._flags.leave(self._index)


class WorkerStepper(StepAgreement):
    """A worker's stepper: scores when its batch is ready (stepping alone), stops when asked (a
    signal, its share of ``--max-events``) or when every worker of the rank is idle.

    Args:
        flags: the rank's idle flags.
        index: this worker's flags.
        metrics: records this worker's step time (:class:`~pipeline.runtime.stepping.StepClock`).
    """

    def __init__(self, flags: IdleFlags, index: int, metrics: Metrics | None = None) -> None:
        self._seat = _Seat(flags, index)
        super().__init__(Alone(), metrics, peers=self._seat)

    def leave(self) -> None:
        """This worker is done: it no longer holds the others back."""
        self._seat.leave()
