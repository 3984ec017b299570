"""When an open batch is scored: as soon as the scorer is free, with headroom, within a budget.

Like an inference server's dynamic batcher (Triton launches a batch as soon as a model
instance is free), the loop does not wait out a fixed delay while the scorer idles; unlike a
plain one, it keeps the loop out of saturation, because on a CPU the loop itself runs the
forward and every batch pays a fixed cost (the forward's per-call work, one Redis round trip,
the produce and the bookkeeping) whatever its size:

- **Free scorer, input drained** (nothing more is queued in the consumer): the batch is held
  until its oldest event has waited as long as one batch's fixed cost (the ski-rental rule:
  waiting that long for company at most doubles the cost of going alone), and then **until it
  holds the headroom rows**: the rows at which, at the recent arrival rate, the loop would be
  busy :data:`TARGET_BUSY_SHARE` of the time (``rate * (fixed / rows + per_row) <= target``).
  An idle loop (low rate) needs few rows, so its batches close early for latency; a loop whose
  busy share climbs lets its batches grow, so that the fixed cost is paid less often. The hold
  ends, whatever the rows, once the batch has been held ``max_delay_ms`` (counted from when
  the scorer became free or its first event arrived, whichever is later: the time spent behind
  the previous batch is queueing, not batching), or once its oldest event's wait plus its
  estimated processing reaches :data:`HOLD_BUDGET_SHARE` of the budget.
- **Input behind** (more is queued): what is queued joins the batch first, up to its row cap.
- **Busy scorer** (a forward in flight, ``overlap``): the batch keeps growing up to
  ``max_batch_rows`` and is scored the moment the forward returns, or once its oldest event has
  waited ``max_delay_ms``.
- **Always**: a batch is scored when waiting any longer would make its oldest event's wait plus
  its estimated processing time exceed ``latency_budget_ms``; and it is cut at the rows whose
  estimated processing still fits that budget (never fewer than the rows at which the fixed
  cost is a fifth of the batch's: below those the budget is lost for this batch, and it takes
  the largest size allowed, to catch up), and at the rows whose estimated processing alone
  takes :data:`MAX_BATCH_BUDGET_SHARE` of the budget (the events that arrive meanwhile wait
  behind it; never fewer than the rows at which the fixed cost is half the batch's).

Waits count from the time the batch's first event was consumed. The processing time of a batch
(enrich, features, forward, top-K, publish) is estimated online by :class:`BatchCost`, a
least-squares line ``fixed + per_row * rows`` over recent batches (exponentially weighted); the
arrival rate and the loop's busy share by :class:`LoopLoad`, over about the last second.

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

__all__ = ["BatchCost", "BatchPolicy", "LoopLoad"]

BUSY_POLL_S = 0.002
"""While a forward is in flight, the loop looks at it at least this often."""

MIN_EFFICIENCY = 0.8
"""A budget cut never makes the fixed cost more than ``1 - MIN_EFFICIENCY`` of a batch."""

TARGET_BUSY_SHARE = 0.6
"""The loop's busy share (batch processing over wall time) the headroom rows aim at: the rest
is left to polling and decoding, to the broker, Redis and the producers on the same cores, and
to absorb a slow batch without a queue building up."""

MAX_BATCH_BUDGET_SHARE = 0.5
"""A batch is cut where its estimated processing alone would take more than this share of the
latency budget: the events that arrive while it is processed wait behind it."""

HOLD_BUDGET_SHARE = 0.5
"""A free scorer holds a batch for headroom only while its oldest event's wait plus the batch's
estimated processing stays within this share of the latency budget."""

LOAD_WINDOW_S = 1.0
"""Time constant of the arrival rate and busy share (:class:`LoopLoad`)."""


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


class LoopLoad:
    """The loop's recent arrival rate (rows per second) and busy share (batch processing per
    wall second), each an exponentially decayed sum over about ``window_s``.

    A sum of events decayed by ``exp(-age / window_s)`` is, in a steady state, the rate times
    ``window_s``; it starts from 0 (an underestimate for the first window: batches close early)
    and decays while nothing happens.

    Args:
        window_s: the time constant.

    Example::

        load = LoopLoad()
        load.arrived(600, now)        # a batch of 600 rows closed
        load.worked(0.012, now)       # a batch took 12 ms to process
        load.rows_per_s(now), load.busy_share(now)
    """

    def __init__(self, window_s: float = LOAD_WINDOW_S) -> None:
        self.window_s = window_s
        self._rows = 0.0
        self._busy = 0.0
        self._at: float | None = None

    def _age(self, now: float) -> None:
        if self._at is not None and now > self._at:
            keep = math.exp(-(now - self._at) / self.window_s)
            self._rows *= keep
            self._busy *= keep
        if self._at is None or now > self._at:
            self._at = now

    def arrived(self, rows: int, now: float) -> None:
        """``rows`` joined a batch that closed at ``now`` (monotonic seconds)."""
        self._age(now)
        self._rows += max(rows, 0)

    def worked(self, seconds: float, now: float) -> None:
        """A batch took ``seconds`` of processing, ending at ``now``."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        self._age(now)
        self._busy += seconds

    def rows_per_s(self, now: float) -> float:
        """Recent rows per second."""
        self._age(now)
        return self._rows / self.window_s

    def busy_share(self, now: float) -> float:
        """Recent share of wall time spent processing batches."""
        self._age(now)
        return self._busy / self.window_s


class BatchPolicy:
    """Decides, per loop iteration, whether the open batch is scored now (module docstring).

    Args:
        max_delay_ms: longest a free scorer holds a batch open for more events (and, with a
            forward in flight, longest its oldest event waits for it).
        latency_budget_ms: a batch's oldest event's wait plus the batch's estimated processing
            time stays within this, when the input allows.
        cost: the processing time estimate (a fresh :class:`BatchCost` by default).
        load: the recent arrival rate and busy share (a fresh :class:`LoopLoad` by default).

    Attributes:
        budget: batches within and over the budget, by cause (:class:`BudgetAccount`).

    Example::

        policy = BatchPolicy(20, 100)
        cap = policy.row_cap(batcher.oldest, now)          # rows the open batch may reach
        ready, wait_s = policy.decide(batcher.rows, batcher.oldest, now, True, source.drained)
    """

    def __init__(
        self,
        max_delay_ms: float,
        latency_budget_ms: float,
        cost: BatchCost | None = None,
        load: LoopLoad | None = None,
    ) -> None:
        self.max_delay_s = max_delay_ms / 1000
        self.budget_s = latency_budget_ms / 1000
        self.cost = cost or BatchCost()
        self.load = load or LoopLoad()
        self.budget = BudgetAccount(self.budget_s)
        self._free_since = -math.inf
        """When the last batch was published: the scorer has been free since."""

    def closed(self, rows: int, oldest: float | None, now: float) -> None:
        """The open batch (``rows``, oldest event consumed at ``oldest``) is closed at ``now``:
        its rows count as arrivals, its budget is charged when its cost arrives
        (:meth:`observe`)."""
        self.load.arrived(rows, now)
        self.budget.closed(rows, oldest, now, self.cost.estimate(rows))

    def observe(self, rows: int, seconds: float, now: float) -> None:
        """A batch of ``rows`` took ``seconds`` from enrich to publish and was published at
        ``now``: the cost model learns from it, the loop was busy for it, its budget is
        charged."""
        self.cost.observe(rows, seconds)
        self.load.worked(seconds, now)
        self.budget.published(rows, seconds, now)
        self._free_since = max(self._free_since, now)

    def headroom_rows(self, now: float) -> int:
        """Rows a batch should hold so that, at the recent arrival rate, processing batches of
        that size keeps the loop busy at most :data:`TARGET_BUSY_SHARE` of the time (0 with no
        recent input; unbounded when even endless batches would not: then the row cap and the
        hold's bound decide)."""
        rate = self.load.rows_per_s(now)
        if rate <= 0:
            return 0
        spare = TARGET_BUSY_SHARE - rate * self.cost.per_row_s
        if spare <= 0:
            return 2**62
        return math.ceil(rate * self.cost.fixed_s / spare)

    def row_cap(self, oldest: float | None, now: float) -> int:
        """Rows the open batch may grow to.

        What fits the budget after the oldest event's wait, never so few that the fixed cost
        exceeds a fifth of the batch; when not even those rows fit (the input is behind: the
        budget is lost for this batch), as many as catch up fastest. In both cases no more
        than what is processed within :data:`MAX_BATCH_BUDGET_SHARE` of the budget, never so
        few that the fixed cost exceeds half of the batch.
        """
        waited = 0.0 if oldest is None else max(0.0, now - oldest)
        cost = self.cost
        within = cost.rows_within(self.budget_s - waited)
        if cost.per_row_s <= 0:
            return max(within, 1)
        share = max(
            cost.rows_within(self.budget_s * MAX_BATCH_BUDGET_SHARE),
            math.ceil(cost.fixed_s / cost.per_row_s),
        )
        efficient = math.ceil(cost.fixed_s * MIN_EFFICIENCY / (1 - MIN_EFFICIENCY) / cost.per_row_s)
        if within < efficient:  # behind: catch up with the largest batch allowed
            within = share
        return max(min(within, share), 1)

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
        estimate = self.cost.estimate(rows)
        left = self.budget_s - waited - estimate
        if left <= 0:
            return True, 0.0
        if not scorer_free:  # look again soon: the batch goes the moment the forward returns
            if waited >= self.max_delay_s:
                return True, 0.0
            return False, min(left, self.max_delay_s - waited, BUSY_POLL_S)
        if not drained:
            return False, 0.0  # take what is queued first
        hold = min(self.cost.fixed_s, self.max_delay_s)
        if waited < hold:
            return False, min(left, hold - waited)
        held = now - max(oldest, self._free_since)  # held by a free scorer, not behind a batch
        missing = self.headroom_rows(now) - rows
        hold_left = min(
            self.max_delay_s - held, self.budget_s * HOLD_BUDGET_SHARE - waited - estimate
        )
        if missing <= 0 or hold_left <= 0:
            return True, 0.0
        rate = self.load.rows_per_s(now)  # > 0: missing > 0 needs recent input
        return False, min(hold_left, missing / rate)
