"""When an open batch is scored: as soon as the scorer is free, within a latency budget.

Like an inference server's dynamic batcher (Triton launches a batch as soon as a model
instance is free), the loop does not wait out a fixed delay while the scorer idles:

- **Free scorer, input drained** (nothing more is queued in the consumer): the batch is scored
  once its oldest event has waited as long as one batch's fixed cost (the ski-rental rule:
  waiting that long for company at most doubles the cost of going alone, and a batch of one
  event on a loaded host costs little more than its fixed part). Under load this is at once:
  what queued during the last forward is already older than that.
- **Busy scorer** (a forward in flight, ``overlap``): the batch keeps growing up to
  ``max_batch_rows`` and is scored the moment the forward returns.
- **Always**: a batch is scored once its oldest event has waited ``max_delay_ms``, or when
  waiting any longer would make its oldest event's wait plus its estimated processing time
  exceed ``latency_budget_ms``; and it is cut at the rows whose estimated processing still fits
  that budget (never fewer than the rows at which the fixed cost is a fifth of the batch's).

Waits count from the time the batch's first event was consumed. The processing time of a batch
(enrich, features, forward, top-K, publish) is estimated online by :class:`BatchCost`, a
least-squares line ``fixed + per_row * rows`` over recent batches (exponentially weighted).

Example::

    policy = BatchPolicy(max_delay_ms=20, latency_budget_ms=100)
    ready, wait_s = policy.decide(rows, oldest, now, scorer_free=True, drained=True)
    policy.closed(rows, oldest, now)       # the loop closes the batch
    policy.observe(rows, seconds, now)     # after each batch: learn its cost, charge its budget

How often batches overran the budget, and why, is kept by :attr:`BatchPolicy.budget`
(:mod:`pipeline.runtime.budget_account`; ``streamrank bench latency`` reports it).
"""

from __future__ import annotations

import math

from pipeline.runtime.budget_account import BudgetAccount

__all__ = ["BatchCost", "BatchPolicy"]

BUSY_POLL_S = 0.002
"""While a forward is in flight, the loop looks at it at least this often."""

MIN_EFFICIENCY = 0.8
"""A budget cut never makes the fixed cost more than ``1 - MIN_EFFICIENCY`` of a batch."""


class BatchCost:
    """Online estimate of one batch's processing seconds: ``fixed + per_row * rows``.

    An exponentially weighted least-squares line through (rows, seconds) of recent batches,
    starting from a prior worth ``prior_weight`` batches. Outliers (a forward that lost the
    CPU) are clipped to four times the estimate before they count.

    Args:
        fixed_s: prior fixed seconds per batch.
        per_row_s: prior seconds per row.
        decay: weight kept by the past at each observation (0.95: about the last 20 batches).
        prior_weight: the prior's weight, in batches, at two sizes.

    Example::

        cost = BatchCost()
        cost.observe(1200, 0.024)
        cost.estimate(4096)
    """

    def __init__(
        self,
        fixed_s: float = 0.002,
        per_row_s: float = 20e-6,
        decay: float = 0.95,
        prior_weight: float = 2.0,
    ) -> None:
        self._decay = decay
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.fixed_s = fixed_s
        """Estimated seconds a batch costs whatever its size."""
        self.per_row_s = per_row_s
        """Estimated seconds per row."""
        for rows in (64.0, 4096.0):  # the prior: two points on its line
            self._add(rows, fixed_s + per_row_s * rows, prior_weight / 2)
        self._fit()

    def estimate(self, rows: int) -> float:
        """Seconds to process a batch of ``rows``."""
        return self.fixed_s + self.per_row_s * rows

    def observe(self, rows: int, seconds: float) -> None:
        """A batch of ``rows`` took ``seconds`` (enrich to publish)."""
        if rows <= 0 or not math.isfinite(seconds) or seconds < 0:
            return
        seconds = min(seconds, 4 * self.estimate(rows))
        for name in ("_w", "_x", "_y", "_xx", "_xy"):
            setattr(self, name, getattr(self, name) * self._decay)
        self._add(float(rows), seconds, 1.0)
        self._fit()

    def rows_within(self, seconds: float) -> int:
        """The most rows whose estimated processing takes at most ``seconds`` (0 if none)."""
        if seconds <= self.fixed_s:
            return 0
        if self.per_row_s <= 0:
            return 2**62
        return int((seconds - self.fixed_s) / self.per_row_s)

    def _add(self, x: float, y: float, weight: float) -> None:
        self._w += weight
        self._x += weight * x
        self._y += weight * y
        self._xx += weight * x * x
        self._xy += weight * x * y

    def _fit(self) -> None:
        spread = self._w * self._xx - self._x * self._x
        if spread <= 1e-9 * max(1.0, self._w * self._xx):  # one size only: keep the slope
            per_row = self.per_row_s
        else:
            per_row = (self._w * self._xy - self._x * self._y) / spread
        per_row = max(per_row, 0.0)
        fixed = (self._y - per_row * self._x) / self._w
        if fixed < 0:  # the line through the origin instead
            fixed, per_row = 0.0, self._xy / self._xx
        self.fixed_s, self.per_row_s = fixed, per_row


class BatchPolicy:
    """Decides, per loop iteration, whether the open batch is scored now (module docstring).

    Args:
        max_delay_ms: longest the oldest event of a batch waits for it to be scored.
        latency_budget_ms: a batch's oldest event's wait plus the batch's estimated processing
            time stays within this, when the input allows.
        cost: the processing time estimate (a fresh :class:`BatchCost` by default).

    Attributes:
        budget: batches within and over the budget, by cause (:class:`BudgetAccount`).

    Example::

        policy = BatchPolicy(20, 100)
        cap = policy.row_cap(batcher.oldest, now)          # rows the open batch may reach
        ready, wait_s = policy.decide(batcher.rows, batcher.oldest, now, True, source.drained)
    """

    def __init__(
        self, max_delay_ms: float, latency_budget_ms: float, cost: BatchCost | None = None
    ) -> None:
        self.max_delay_s = max_delay_ms / 1000
        self.budget_s = latency_budget_ms / 1000
        self.cost = cost or BatchCost()
        self.budget = BudgetAccount(self.budget_s)

    def closed(self, rows: int, oldest: float | None, now: float) -> None:
        """The open batch (``rows``, oldest event consumed at ``oldest``) is closed at ``now``:
        its budget is charged when its cost arrives (:meth:`observe`)."""
        self.budget.closed(rows, oldest, now, self.cost.estimate(rows))

    def observe(self, rows: int, seconds: float, now: float) -> None:
        """A batch of ``rows`` took ``seconds`` from enrich to publish and was published at
        ``now``: the cost model learns from it and its budget is charged."""
        self.cost.observe(rows, seconds)
        self.budget.published(rows, seconds, now)

    def row_cap(self, oldest: float | None, now: float) -> int:
        """Rows the open batch may grow to: what fits the budget after the oldest event's wait,
        but never so few that the fixed cost exceeds a fifth of the batch."""
        waited = 0.0 if oldest is None else max(0.0, now - oldest)
        cost = self.cost
        efficient = (
            0
            if cost.per_row_s <= 0
            else math.ceil(cost.fixed_s * MIN_EFFICIENCY / (1 - MIN_EFFICIENCY) / cost.per_row_s)
        )
        return max(cost.rows_within(self.budget_s - waited), efficient, 1)

    def decide(
        self, rows: int, oldest: float | None, now: float, scorer_free: bool, drained: bool
    ) -> tuple[bool, float]:
        """Whether to score the open batch now, else how long to wait for input at most.

        Args:
            rows: the open batch's rows (0: empty).
            oldest: when its first event was consumed (``None``: empty).
            now: monotonic time now.
            scorer_free: no forward in flight.
            drained: nothing more is queued in the consumer now.

        Returns:
            ``(score_now, wait_s)``: ``wait_s`` is the longest the loop may block waiting for
            input before deciding again (``inf`` for an empty batch: the loop's own poll
            timeout applies).
        """
        if oldest is None or rows <= 0:
            return False, math.inf
        waited = max(0.0, now - oldest)
        left = min(
            self.max_delay_s - waited,
            self.budget_s - waited - self.cost.estimate(rows),
        )
        if left <= 0:
            return True, 0.0
        if not scorer_free:  # look again soon: the batch goes the moment the forward returns
            return False, min(left, BUSY_POLL_S)
        if not drained:
            return False, 0.0  # take what is queued first
        hold = min(self.cost.fixed_s, self.max_delay_s)
        if waited >= hold:
            return True, 0.0
        return False, min(left, hold - waited)
