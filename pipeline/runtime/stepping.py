"""When to score: the per-iteration step decision of the loop, alone or agreed across members.

The loop asks its stepper once per iteration, with one :class:`LocalStep` (what this member
brings: is its batch ready, how many rows, was it asked to stop, is it idle, does a failed
batch wait to be bisected, its model swap offer) and acts on the one :class:`StepDecision` it
gets back. There is one stepper, :class:`StepAgreement`; what differs between a single process
and the ranks of a sharded model is only its :class:`StepTransport`, which combines the members'
steps as an elementwise MAX of a few integers:

- :class:`Alone` (a single process, an ingest worker): the MAX of one member is its own step;
  a ready batch is scored at once.
- :class:`ProcessGroup` (ranks of a sharded model): one small ``all_reduce`` per iteration. Every
  forward is a collective (the embedding lookups), so all ranks step together: whether anyone's
  batch is ready, the largest batch (everyone pads to it), and whether to stop. A rank with no
  input still joins, so nobody waits forever; the batch deadline (``max_delay_ms``) of any rank
  triggers a step for all, which keeps the latency bound.

The same vector carries each member's :class:`SwapOffer` (the model version generation it has
loaded, whether the load succeeded, whether its decoded events are all batched), so that the
ranks switch model versions at the same step (:mod:`pipeline.runtime.model_swap`): the agreed
generation is one that every rank offers (its MIN and MAX agree).

The same transport is the barrier at the end of a drain (:meth:`StepAgreement.all_drained`):
ranks leave the consumer group only once every rank has committed (a member that leaves starts
a rebalance, which would fail the others' last commits). Members that step alone but end
together (the ingest workers of one rank, :mod:`pipeline.ingest.stepping`) pass :class:`Peers`:
their idleness and their drains are shared through it.

Example::

    stepper = StepAgreement(ProcessGroup(dist.new_group(backend="gloo")), metrics)
    step = stepper.agree(LocalStep(ready=True, rows=120, stop_requested=False, idle=False))
    step.run, step.rows  # True, the largest batch of any rank
"""

from __future__ import annotations

import dataclasses
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
class LocalStep:
    """What this member brings to an iteration's step (the loop's one step state).

    Attributes:
        ready: its open batch should be scored now (full, holding an event that did not fit,
            due by the batch policy, or waited for by a model swap).
        rows: the open batch's rows.
        stop_requested: asked to stop (a signal, ``max_events`` reached).
        idle: no input and nothing to do for ``exit_when_idle_s``.
        isolate: a batch of this member failed after its collective forward and waits to be
            bisected by every rank together.
        offer: its side of a model swap.
        rewind: its transaction failed (exactly-once): every member drops its open work and
            goes back to its last committed offsets.
    """

    ready: bool
    rows: int
    stop_requested: bool
    idle: bool
    isolate: bool = False
    offer: SwapOffer = NO_SWAP
    rewind: bool = False

    def vector(self) -> list[int]:
        """The step as integers whose elementwise MAX over members is the agreed step (a MIN
        is the MAX of the negation)."""
        offer = self.offer
        return [
            int(self.ready),
            self.rows,
            int(self.stop_requested),
            int(not self.idle),
            int(self.isolate),
            offer.generation,
            -offer.generation,
            -int(offer.ok),
            -int(offer.drained),
            int(self.rewind),
        ]


@dataclass(frozen=True)
class StepDecision:
    """What every member does in this iteration.

    Attributes:
        run: score now (every rank, even with an empty batch).
        rows: the largest batch among the ranks (pad to it); equals local rows when alone.
        stop: finish this step, commit and leave the loop.
        isolate: a rank's batch failed after its collective forward: every rank bisects
            together first (:meth:`~pipeline.runtime.processor.BatchProcessor.isolate_together`).
        swap: the model swap every rank offered (:class:`SwapOffer`).
        rewind: some member's transaction failed: every member drops its open work, aborts its
            transaction and goes back to its last committed offsets, at this step
            (:meth:`~pipeline.runtime.drain.Drain.rewind`).
    """

    run: bool
    rows: int
    stop: bool
    isolate: bool = False
    swap: SwapOffer = NO_SWAP
    rewind: bool = False

    @classmethod
    def agreed(cls, maxima: list[int], collective: bool) -> StepDecision:
        """The decision from the MAX of the members' :meth:`LocalStep.vector`.

        Args:
            maxima: the elementwise MAX.
            collective: forwards are collectives: a step runs only with rows to pad to (alone,
                a ready step runs even when empty).
        """
        (any_ready, max_rows, any_stop, any_busy, any_isolate, max_gen, neg_min_gen, neg_ok,
         neg_drained, any_rewind) = maxima  # fmt: skip
        swap = SwapOffer(
            generation=max_gen if max_gen == -neg_min_gen else 0,
            ok=neg_ok == -1,
            drained=neg_drained == -1,
        )
        return cls(
            run=bool(any_ready) and (max_rows > 0 or not collective),
            rows=max_rows,
            stop=bool(any_stop) or not any_busy,
            isolate=bool(any_isolate),
            swap=swap,
            rewind=bool(any_rewind),
        )


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
    """What the loop asks once per iteration (:class:`StepAgreement` is the implementation;
    tests stand in for it)."""

    poll_timeout_s: float
    """Longest a Kafka poll may block per iteration."""
    collective: bool
    """Every forward is a collective of the ranks (pad to the agreed rows, never alone)."""

    def agree(self, local: LocalStep) -> StepDecision:
        """Decide this iteration's step from the local one."""
        ...

    def all_ok(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every rank (a collective with several ranks: every rank
        calls it at the same step)."""
        ...

    def all_drained(self, done: bool) -> bool:
        """One round of the drain's barrier: whether every member has ended its drain
        (``done`` once true stays true; with ranks, every rank calls it at the same round)."""
        ...


class StepTransport(Protocol):
    """Where the members' steps meet."""

    collective: bool
    """Several ranks, every forward a collective."""
    poll_timeout_s: float
    """Longest a Kafka poll may block per iteration (short with ranks: they meet often)."""

    def max(self, values: list[int]) -> list[int]:
        """The elementwise MAX of ``values`` over the members (each calls it at the same
        step)."""
        ...


class Alone:
    """The transport of a member that steps alone: the MAX of one is its own values."""

    collective = False
    poll_timeout_s = 0.1

    def max(self, values: list[int]) -> list[int]:
        return values


class ProcessGroup:
    """The ranks of a sharded model: one ``all_reduce(MAX)`` per call.

    Args:
        group: a process group for the control messages (gloo, on CPU); the default group when
            ``None``. With NCCL for the model, pass a separate gloo group so control traffic
            never syncs the GPU.
        poll_timeout_s: short, so ranks meet often under light load.
    """

    collective = True

    def __init__(self, group: dist.ProcessGroup | None = None, poll_timeout_s: float = 0.01):
        self._group = group
        self.poll_timeout_s = poll_timeout_s

    def max(self, values: list[int]) -> list[int]:
        state = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(state, op=dist.ReduceOp.MAX, group=self._group)
        return [int(v) for v in state.tolist()]


class Peers(Protocol):
    """Members that step alone but end together (the ingest workers of a rank)."""

    def all_idle(self, idle: bool) -> bool:
        """Report this member's idleness; whether every member is idle (or has left)."""
        ...

    def all_drained(self, done: bool) -> bool:
        """Report that this member drains (``done``: its drain has ended); whether every member
        that drains has ended its drain (members still running are not waited for)."""
        ...


class StepClock:
    """This member's step time: from a ``run`` decision to the next decision (the step's work).

    Args:
        metrics: where to record it (:meth:`~pipeline.observability.metrics.Metrics.record_step`);
            ``None`` records nothing.
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


class StepAgreement:
    """The stepper: one :class:`LocalStep` in, one :class:`StepDecision` out, over a transport.

    - ``run``: some member's batch is full, held an event that did not fit, or is due;
    - ``rows``: the largest local batch;
    - ``stop``: some member was asked to stop (SIGTERM, ``max_events``), or *every* member is
      idle;
    - ``isolate``: some rank's batch failed after the collective forward (all bisect together);
    - ``swap``: the MAX and (as the MAX of its negation) the MIN of the offered generation,
      and the MIN of ``ok`` and ``drained``: a generation is agreed when MIN = MAX;
    - ``rewind``: some member's transaction failed (all rewind together).

    Args:
        transport: :class:`Alone` (default) or :class:`ProcessGroup`.
        metrics: when given, records this member's step time (:class:`StepClock`) and, with
            ranks, the ``all_reduce``'s latency
            (:meth:`~pipeline.observability.metrics.Metrics.record_collective`).
        peers: members that step alone but stop on idleness together (ingest workers).

    Example::

        stepper = StepAgreement(Alone(), metrics)
        stepper.agree(LocalStep(ready=True, rows=8, stop_requested=False, idle=False)).run
    """

    def __init__(
        self,
        transport: StepTransport | None = None,
        metrics: Metrics | None = None,
        peers: Peers | None = None,
    ) -> None:
        self._transport: StepTransport = transport or Alone()
        self.collective = self._transport.collective
        self.poll_timeout_s = self._transport.poll_timeout_s
        self._metrics = metrics
        self._peers = peers
        self._clock = StepClock(metrics)

    def agree(self, local: LocalStep) -> StepDecision:
        start = self._clock.deciding()
        if self._peers is not None:
            idle = self._peers.all_idle(local.idle) and local.idle
            local = dataclasses.replace(local, idle=idle)
        decision = StepDecision.agreed(self._transport.max(local.vector()), self.collective)
        end = self._clock.decided(decision)
        if self._metrics is not None and self.collective:
            self._metrics.record_collective(STEP_AGREE, end - start)
        return decision

    def agree_attempt(self, rows: int | None) -> int | None:
        """One round of a collective bisection (:class:`IsolationRounds`): the MAX of (needs an
        attempt, its rows). Alone, an attempt pads to nothing."""
        if not self.collective:
            return rows
        needed, max_rows = self._transport.max([int(rows is not None), rows or 0])
        return max(max_rows, 1) if needed else None

    def all_ok(self, ok: bool) -> bool:
        return self._transport.max([-int(ok)]) == [-1]

    def all_drained(self, done: bool) -> bool:
        if self._peers is not None:
            done = self._peers.all_drained(done)
        return self.all_ok(done)
