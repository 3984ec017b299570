"""When an ingest worker stops on idleness: only when every worker of its rank is idle.

A worker's loop decides its steps alone (its forwards are its own requests; the rank's server
does the collective part with other ranks), but ``--exit-when-idle`` means the same as for the
ranks of a sharded job: stop once *all* are idle. One worker alone may look idle while the group
is still moving partitions to it (the cooperative protocol assigns a newcomer nothing in its
first round and its partitions in a second one); if it left then, its partitions would wait for
the next rebalance while it exits. So each worker publishes whether it is idle in a flag of a
small shared array (:class:`IdleFlags`), and its stepper (the one
:class:`~pipeline.runtime.stepping.StepAgreement`, stepping alone, with the rank's other workers
as its :class:`~pipeline.runtime.stepping.Peers`) stops on idleness only when every flag is up (a
worker that has exited keeps its flag up).

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


class IdleFlags:
    """One flag per worker of a rank, in shared memory: whether that worker is idle.

    Args:
        flags: int8[K], shared (:meth:`allocate`).
    """

    def __init__(self, flags: torch.Tensor) -> None:
        self.flags = flags

    @classmethod
    def allocate(cls, count: int) -> IdleFlags:
        """Flags for ``count`` workers, all down (passed to the spawned workers)."""
        return cls(torch.zeros(count, dtype=torch.int8).share_memory_())

    def set(self, index: int, idle: bool) -> None:
        """Worker ``index`` is idle now (or not)."""
        self.flags[index] = int(idle)

    @property
    def all_idle(self) -> bool:
        """Every worker is idle (or has exited)."""
        return bool(self.flags.all())


class _Seat:
    """One worker's place among its rank's workers (:class:`~pipeline.runtime.stepping.Peers`)."""

    def __init__(self, flags: IdleFlags, index: int) -> None:
        self._flags = flags
        self._index = index

    def all_idle(self, idle: bool) -> bool:
        self._flags.set(self._index, idle)
        return self._flags.all_idle

    def leave(self) -> None:
        self._flags.set(self._index, True)


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
