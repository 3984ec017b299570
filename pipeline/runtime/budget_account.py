"""How often a batch overran its latency budget, and why: the batch policy's decision against
what the batch then took.

The batch policy (:mod:`pipeline.runtime.batch_policy`) closes a batch when its oldest event's
wait plus the batch's *estimated* processing still fits ``batching.latency_budget_ms``. Whether
it did is known only once the batch is published. :class:`BudgetAccount` keeps, for each batch
the loop closes, when its oldest event was consumed, when it closed and the cost model's
estimate; when the loop reports the batch's processing time (the processor's
``take_costs()``, in publishing order) the two are matched and the batch is charged:

- **in budget**: oldest event consumed -> batch published within the budget;
- **over budget**, with the first cause that explains it:
  - ``closed_late``: at its close, the wait already plus the estimate exceeded the budget (it
    grew while the forward was busy, or waited ``max_delay_ms``, or the budget is below one
    batch's cost);
  - ``slower_than_estimated``: the processing took longer than estimated (a cost model that
    misses contention);
  - ``queued``: neither; it waited between its close and its processing (behind the batch in
    flight).

Nothing here calls back into the loop: the loop tells it about closes and costs.

Example::

    account = BudgetAccount(budget_s=0.1)
    account.closed(rows=1200, oldest=t0, now=t1, estimate_s=0.03)
    account.published(rows=1200, seconds=0.05, now=t2)
    account.as_dict()["over_budget_share"]
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BudgetAccount"]

MAX_PENDING = 64
"""Closed batches remembered until their cost arrives (one or two are in flight)."""

CAUSES = ("closed_late", "slower_than_estimated", "queued")


@dataclass(frozen=True)
class _Closed:
    rows: int
    oldest: float
    closed_at: float
    estimate_s: float


@dataclass
class BudgetAccount:
    """Batches within and over ``budget_s`` (see the module docstring); constant memory.

    Attributes:
        budget_s: ``batching.latency_budget_ms`` in seconds.
        batches: published batches matched with their close.
        over_budget: those whose oldest event waited + was processed beyond the budget.
        causes: over-budget batches by cause.
        unmatched: costs reported for batches the loop did not close (a batch bisected or
            processed during a revocation).
        worst_s: the longest oldest-event-to-publish time seen.
        estimate_ratio_sum: sum of processing / estimate (its mean says how far the cost
            model is off).
    """

    budget_s: float
    batches: int = 0
    over_budget: int = 0
    causes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    unmatched: int = 0
    worst_s: float = 0.0
    estimate_ratio_sum: float = 0.0
    slower_than_estimated_batches: int = 0
    _pending: deque[_Closed] = field(default_factory=lambda: deque(maxlen=MAX_PENDING))

    def closed(self, rows: int, oldest: float | None, now: float, estimate_s: float) -> None:
        """The loop closed a batch of ``rows`` whose oldest event was consumed at ``oldest``
        (monotonic seconds), expecting ``estimate_s`` of processing."""
        if oldest is None or rows <= 0:
            return
        self._pending.append(_Closed(rows, oldest, now, estimate_s))

    def published(self, rows: int, seconds: float, now: float) -> None:
        """A batch of ``rows`` was published at ``now`` after ``seconds`` of processing
        (costs arrive in publishing order, the order batches were closed)."""
        pending = self._pending
        match = next((i for i, c in enumerate(pending) if c.rows == rows), None)
        if match is None:
            self.unmatched += 1
            return
        for _ in range(match):  # closed but never published as one (bisected, revoked)
            pending.popleft()
        closed = pending.popleft()
        total = now - closed.oldest
        self.batches += 1
        self.worst_s = max(self.worst_s, total)
        if closed.estimate_s > 0:
            self.estimate_ratio_sum += seconds / closed.estimate_s
        slower = seconds > closed.estimate_s
        self.slower_than_estimated_batches += slower
        if total <= self.budget_s:
            return
        self.over_budget += 1
        waited = closed.closed_at - closed.oldest
        if waited + closed.estimate_s > self.budget_s:
            self.causes["closed_late"] += 1
        elif slower:
            self.causes["slower_than_estimated"] += 1
        else:
            self.causes["queued"] += 1

    def as_dict(self) -> dict[str, Any]:
        """The account, JSON-ready (``over_budget_share`` is ``None`` before any batch)."""
        n = self.batches
        return {
            "budget_ms": round(self.budget_s * 1000, 1),
            "batches": n,
            "over_budget": self.over_budget,
            "over_budget_share": round(self.over_budget / n, 4) if n else None,
            "over_budget_causes": dict(self.causes),
            "slower_than_estimated_share": (
                round(self.slower_than_estimated_batches / n, 4) if n else None
            ),
            "processing_over_estimate_mean": round(self.estimate_ratio_sum / n, 3) if n else None,
            "worst_oldest_to_publish_ms": round(self.worst_s * 1000, 1),
            "unmatched": self.unmatched,
        }
