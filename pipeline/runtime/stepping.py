"""When to score: the per-iteration step decision of the loop, alone or agreed across ranks.

The loop asks its stepper once per iteration. A single process scores as soon as its batch is
ready. Ranks of a sharded model must run every forward together (the embedding lookups are
collectives), so :class:`CollectiveStepper` agrees with one small ``all_reduce`` per iteration:
whether anyone's batch is ready, the largest batch (everyone pads to it), and whether to stop.
A rank with no input still joins, so nobody waits forever; the batch deadline
(``max_delay_ms``) of any rank triggers a step for all, which keeps the latency bound.

The same ``all_reduce`` carries each rank's :class:`SwapOffer` (the model version generation it
has loaded, whether the load succeeded, whether its decoded events are all batched), so that
the ranks switch model versions at the same step (:mod:`pipeline.runtime.model_swap`): the agreed
generation is one that every rank offers (its MIN and MAX agree).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from pipeline.observability.metrics import STEP_AGREE, Metrics


@dataclass(frozen=True)
class SwapOffer:
    """A rank's side of a model swap, or (in a :class:`StepDecision`) what all ranks agree on.

    Attributes:
        generation: the versions pointer generation of the model this rank has loaded (or
            failed to load); 0: none. Agreed: the generation every rank offers, else 0.
        ok: the load succeeded (agreed: on every rank).
        drained: nothing decoded waits to join a batch (agreed: on every rank).
    """

    generation: int = 0
    ok: bool = True
    drained: bool = True


NO_SWAP = SwapOffer()


@dataclass(frozen=True)
class StepDecision:
    """What every rank does in this iteration.

    Attributes:
        run: score now (every rank, even with an empty batch).
        rows: the largest batch among the ranks (pad to it); equals local rows when alone.
        stop: finish this step, commit and leave the loop.
        isolate: a rank's batch failed after its collective forward: every rank bisects
            together first (:meth:`~pipeline.runtime.processor.BatchProcessor.isolate_together`).
        swap: the model swap every rank offered (:class:`SwapOffer`).
    """

    run: bool
    rows: int
    stop: bool
    isolate: bool = False
    swap: SwapOffer = NO_SWAP


class IsolationRounds(Protocol):
    """How ranks bisect failed batches together: one collective forward per round."""

    def agree_attempt(self, rows: int | None) -> int | None:
        """Whether some rank needs one more attempt, and the rows every rank pads to.

        Args:
            rows: this rank's attempt's rows; ``None``: it has nothing left to try.

        Returns:
            The largest attempt's rows (every rank runs one forward padded to it), or ``None``
            when no rank has anything left (the isolation is over everywhere).
        """
        ...


class Stepper(IsolationRounds, Protocol):
    poll_timeout_s: float
    """Longest a Kafka poll may block per iteration."""

    def agree(
        self,
        ready: bool,
        rows: int,
        stop_requested: bool,
        idle: bool,
        isolate: bool = False,
        offer: SwapOffer = NO_SWAP,
    ) -> StepDecision:
        """Decide this iteration's step from the local state."""
        ...

    def all_ok(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every rank (a collective with several ranks: every rank
        calls it at the same step)."""
        ...


class StepClock:
    """This rank's step time: from a ``run`` decision to the next decision (the step's work).

    Args:
        metrics: where to record it (:meth:`~pipeline.observability.metrics.Metrics.record_step`);
        ``None``
            records nothing.
    """

    def __init__(self, metrics: Metrics | None) -> None:
        self._metrics = metrics
        self._started: float | None = None

    def deciding(self) -> float:
        """Call before deciding: closes the step in progress. Returns the time now."""
        now = time.perf_counter()
        if self._metrics is not None and self._started is not None:
            self._metrics.record_step(now - self._started)
        return now

    def decided(self, decision: StepDecision) -> float:
        """Call after deciding: a ``run`` opens a step. Returns the time now."""
        now = time.perf_counter()
        self._started = now if decision.run else None
        return now


class LocalStepper:
    """Single process: score when ready; stop when asked or idle.

    Args:
        metrics: when given, records this process's step time (:class:`StepClock`).
    """

    poll_timeout_s = 0.1

    def __init__(self, metrics: Metrics | None = None) -> None:
        self._clock = StepClock(metrics)

    def agree(
        self,
        ready: bool,
        rows: int,
        stop_requested: bool,
        idle: bool,
        isolate: bool = False,
        offer: SwapOffer = NO_SWAP,
    ) -> StepDecision:
        self._clock.deciding()
        decision = StepDecision(run=ready, rows=rows, stop=stop_requested or idle, swap=offer)
        self._clock.decided(decision)
        return decision

    def agree_attempt(self, rows: int | None) -> int | None:
        """Alone, an attempt pads to nothing (a single process bisects without rounds)."""
        return rows

    def all_ok(self, ok: bool) -> bool:
        return ok


class CollectiveStepper:
    """Ranks agree with one ``all_reduce(MAX)`` of nine integers per iteration.

    - ``run``: some rank's batch is full, held an event that did not fit, or is due;
    - ``rows``: the largest local batch;
    - ``stop``: some rank was asked to stop (SIGTERM, ``max_events``), or *every* rank is idle;
    - ``isolate``: some rank's batch failed after the collective forward (all bisect together);
    - ``swap``: the MAX and (as the MAX of its negation) the MIN of the offered generation,
      and the MIN of ``ok`` and ``drained``: a generation is agreed when MIN = MAX.

    Args:
        group: a process group for the control messages (gloo, on CPU); the default group when
            ``None``. With NCCL for the model, pass a separate gloo group so control traffic
            never syncs the GPU.
        poll_timeout_s: short, so ranks meet often under light load.
        metrics: when given, records the ``all_reduce``'s latency
            (:meth:`~pipeline.observability.metrics.Metrics.record_collective`) and, as this rank's
            step time
            (:meth:`~pipeline.observability.metrics.Metrics.record_step`), the time from a ``run``
            decision
            to the next agreement, i.e. the rank's work for that step.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        poll_timeout_s: float = 0.01,
        metrics: Metrics | None = None,
    ) -> None:
        self._group = group
        self.poll_timeout_s = poll_timeout_s
        self._metrics = metrics
        self._clock = StepClock(metrics)

    def agree(
        self,
        ready: bool,
        rows: int,
        stop_requested: bool,
        idle: bool,
        isolate: bool = False,
        offer: SwapOffer = NO_SWAP,
    ) -> StepDecision:
        start = self._clock.deciding()
        state = torch.tensor(
            [
                int(ready),
                rows,
                int(stop_requested),
                int(not idle),
                int(isolate),
                offer.generation,
                -offer.generation,
                -int(offer.ok),
                -int(offer.drained),
            ],
            dtype=torch.int64,
        )
        dist.all_reduce(state, op=dist.ReduceOp.MAX, group=self._group)
        (any_ready, max_rows, any_stop, any_busy, any_isolate, max_gen, neg_min_gen, neg_ok,
         neg_drained) = (int(v) for v in state.tolist())  # fmt: skip
        swap = SwapOffer(
            generation=max_gen if max_gen == -neg_min_gen else 0,
            ok=neg_ok == -1,
            drained=neg_drained == -1,
        )
        stop = bool(any_stop) or not any_busy
        decision = StepDecision(
            run=bool(any_ready) and max_rows > 0,
            rows=max_rows,
            stop=stop,
            isolate=bool(any_isolate),
            swap=swap,
        )
        end = self._clock.decided(decision)
        if self._metrics is not None:
            self._metrics.record_collective(STEP_AGREE, end - start)
        return decision

    def agree_attempt(self, rows: int | None) -> int | None:
        """One round of a collective bisection (:class:`IsolationRounds`): ``all_reduce(MAX)``
        of (needs an attempt, its rows)."""
        state = torch.tensor([int(rows is not None), rows or 0], dtype=torch.int64)
        dist.all_reduce(state, op=dist.ReduceOp.MAX, group=self._group)
        needed, max_rows = (int(v) for v in state.tolist())
        return max(max_rows, 1) if needed else None

    def all_ok(self, ok: bool) -> bool:
        flag = torch.tensor([-int(ok)], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return int(flag.item()) == -1
