"""The batch policy: score when the scorer is free, hold for the headroom rows while the loop is
busy, stay within the delay cap and the latency budget; the online cost line; the loop's load;
a loop simulated on a fake clock."""

from __future__ import annotations

import math

import pytest

from pipeline.runtime.batch_policy import (
    BUSY_POLL_S,
    HOLD_BUDGET_SHARE,
    MAX_BATCH_BUDGET_SHARE,
    TARGET_BUSY_SHARE,
    BatchCost,
    BatchPolicy,
    LoopLoad,
)


def _cost(fixed_s: float, per_row_s: float) -> BatchCost:
    """A cost line that has learnt (fixed_s, per_row_s) exactly."""
    cost = BatchCost(fixed_s, per_row_s)
    for rows in (10, 500, 3000) * 5:
        cost.observe(rows, fixed_s + per_row_s * rows)
    return cost


class TestBatchCost:
    def test_learns_the_fixed_and_per_row_cost_of_recent_batches(self) -> None:
        cost = BatchCost(fixed_s=0.010, per_row_s=1e-6)  # a wrong prior
        for _ in range(200):
            for rows in (50, 800, 4000):
                cost.observe(rows, 0.003 + 20e-6 * rows)
        assert cost.fixed_s == pytest.approx(0.003, rel=0.02)
        assert cost.per_row_s == pytest.approx(20e-6, rel=0.02)
        assert cost.estimate(1000) == pytest.approx(0.023, rel=0.02)

    def test_one_batch_size_only_keeps_a_slope_and_fits_the_level(self) -> None:
        cost = BatchCost(fixed_s=0.002, per_row_s=20e-6)
        for _ in range(300):
            cost.observe(4096, 0.002 + 30e-6 * 4096)
        assert cost.estimate(4096) == pytest.approx(0.002 + 30e-6 * 4096, rel=0.05)
        assert cost.fixed_s >= 0 and cost.per_row_s >= 0

    def test_an_outlier_counts_at_most_four_times_the_estimate(self) -> None:
        cost = _cost(0.002, 20e-6)
        before = cost.estimate(1000)
        cost.observe(1000, 100.0)  # a forward that lost the CPU for 100 s
        assert cost.estimate(1000) < 1.5 * before

    def test_nonsense_observations_are_ignored(self) -> None:
        cost = _cost(0.002, 20e-6)
        before = (cost.fixed_s, cost.per_row_s)
        for rows, seconds in ((0, 0.1), (10, math.nan), (10, -1.0)):
            cost.observe(rows, seconds)
        assert (cost.fixed_s, cost.per_row_s) == before

    def test_rows_within_inverts_the_estimate(self) -> None:
        cost = _cost(0.002, 20e-6)
        rows = cost.rows_within(0.052)
        assert rows == pytest.approx(2500, abs=5)
        assert cost.estimate(rows) <= 0.052 + 1e-9
        assert cost.rows_within(0.001) == 0


class TestBatchPolicy:
    def policy(self, fixed_s: float = 0.003, per_row_s: float = 20e-6) -> BatchPolicy:
        return BatchPolicy(max_delay_ms=20, latency_budget_ms=100, cost=_cost(fixed_s, per_row_s))

    def test_an_empty_batch_is_never_ready_and_leaves_the_wait_to_the_loop(self) -> None:
        assert self.policy().decide(0, None, 5.0, True, True) == (False, math.inf)

    def test_a_free_scorer_holds_a_fresh_batch_for_at_most_one_fixed_cost(self) -> None:
        policy = self.policy(fixed_s=0.003)
        ready, wait_s = policy.decide(60, oldest=10.0, now=10.001, scorer_free=True, drained=True)
        assert not ready and wait_s == pytest.approx(0.002, abs=1e-4)
        assert policy.decide(60, 10.0, 10.003, True, True) == (True, 0.0)

    def test_events_that_already_waited_are_scored_at_once(self) -> None:
        # queued during the last forward: older than the hold when the loop sees them
        assert self.policy().decide(600, 10.0, 10.030, True, True)[0]

    def test_queued_input_is_taken_before_scoring(self) -> None:
        assert self.policy().decide(60, 10.0, 10.010, True, drained=False) == (False, 0.0)

    def test_a_busy_scorer_lets_the_batch_grow_and_looks_again_soon(self) -> None:
        ready, wait_s = self.policy().decide(60, 10.0, 10.010, scorer_free=False, drained=True)
        assert not ready and wait_s == BUSY_POLL_S

    def test_max_delay_caps_the_wait_even_behind_a_busy_scorer(self) -> None:
        assert self.policy().decide(60, 10.0, 10.021, False, False) == (True, 0.0)

    def test_the_budget_scores_a_batch_before_wait_plus_processing_would_exceed_it(self) -> None:
        policy = BatchPolicy(1000, 100, cost=_cost(0.003, 20e-6))  # delay cap out of the way
        # 4000 rows: 83 ms of processing; after 15 ms of waiting it would end at 98 ms
        ready, wait_s = policy.decide(4000, 10.0, 10.014, False, True)
        assert not ready and wait_s == pytest.approx(BUSY_POLL_S)
        assert policy.decide(4000, 10.0, 10.018, False, True) == (True, 0.0)

    def test_row_cap_fits_the_budget_after_the_wait_but_keeps_batches_efficient(self) -> None:
        policy = self.policy(fixed_s=0.003, per_row_s=10e-6)
        # a fresh batch: at most the rows processed within half of the budget
        share = (0.100 * MAX_BATCH_BUDGET_SHARE - 0.003) / 10e-6
        assert policy.row_cap(None, 10.0) == pytest.approx(share, abs=2)
        # after 60 ms of waiting: what still fits the budget
        assert policy.row_cap(10.0, 10.060) == pytest.approx((0.040 - 0.003) / 10e-6, abs=2)
        # 80 ms: 1,700 rows still fit, more than the rows at which the fixed cost is a fifth
        assert policy.row_cap(10.0, 10.080) == pytest.approx((0.020 - 0.003) / 10e-6, abs=2)

    def test_a_batch_that_cannot_make_its_budget_grows_to_catch_up(self) -> None:
        policy = self.policy(fixed_s=0.003, per_row_s=10e-6)
        share = policy.row_cap(None, 10.0)
        # 90 ms: fewer rows than those at which the fixed cost is a fifth would fit: the budget
        # is lost for this batch, and the largest batch allowed catches up fastest
        assert policy.row_cap(10.0, 10.090) == share
        assert policy.row_cap(10.0, 11.0) == share  # waited 1 s: the input is behind

    def test_the_share_cap_never_leaves_the_fixed_cost_more_than_half_a_batch(self) -> None:
        policy = self.policy(fixed_s=0.060, per_row_s=20e-6)  # a fixed cost past half the budget
        assert policy.row_cap(None, 10.0) == math.ceil(0.060 / 20e-6)


def _busy_policy(
    rows_per_s: float, fixed_s: float = 0.003, per_row_s: float = 10e-6
) -> BatchPolicy:
    """A policy whose loop has seen ``rows_per_s`` arrive for a while, ending at t = 10 s."""
    policy = BatchPolicy(max_delay_ms=20, latency_budget_ms=100, cost=_cost(fixed_s, per_row_s))
    for i in range(400):  # 4 s of batches every 10 ms
        policy.load.arrived(round(rows_per_s * 0.010), 6.0 + i * 0.010)
    policy.observe(600, policy.cost.estimate(600), 9.995)  # the last batch ended at 9.995
    return policy


class TestHeadroom:
    def test_the_load_converges_to_the_rate_and_the_busy_share(self) -> None:
        load = LoopLoad(window_s=1.0)
        for i in range(1000):  # 10 s: 300 rows and 6 ms of work every 10 ms
            load.arrived(300, i * 0.010)
            load.worked(0.006, i * 0.010)
        assert load.rows_per_s(9.99) == pytest.approx(30_000, rel=0.02)
        assert load.busy_share(9.99) == pytest.approx(0.6, rel=0.02)

    def test_the_load_fades_when_nothing_happens(self) -> None:
        load = LoopLoad(window_s=1.0)
        load.arrived(1000, 0.0)
        assert load.rows_per_s(3.0) == pytest.approx(1000 * math.exp(-3.0))
        load.worked(math.nan, 3.0)  # ignored
        assert load.busy_share(3.0) == 0.0

    def test_headroom_rows_keep_the_projected_busy_share_at_the_target(self) -> None:
        policy = _busy_policy(30_000)
        rate = policy.load.rows_per_s(10.0)
        rows = policy.headroom_rows(10.0)
        projected = rate * (0.003 / rows + 10e-6)
        assert projected == pytest.approx(TARGET_BUSY_SHARE, rel=0.01)

    def test_no_input_needs_no_headroom_and_too_much_needs_endless_batches(self) -> None:
        assert self_policy().headroom_rows(10.0) == 0
        assert _busy_policy(TARGET_BUSY_SHARE / 10e-6 * 1.1).headroom_rows(10.0) >= 2**62

    def test_an_idle_loop_closes_after_one_fixed_cost(self) -> None:
        policy = _busy_policy(2_000)  # 60 ms of work per second: few rows are enough
        assert policy.headroom_rows(10.0) < 60
        assert policy.decide(60, oldest=10.0, now=10.003, scorer_free=True, drained=True)[0]

    def test_a_busy_loop_holds_the_batch_until_the_headroom_rows_arrive(self) -> None:
        policy = _busy_policy(30_000)
        target = policy.headroom_rows(10.001)
        ready, wait_s = policy.decide(120, oldest=10.0, now=10.004, scorer_free=True, drained=True)
        rate = policy.load.rows_per_s(10.004)
        assert not ready and wait_s == pytest.approx((target - 120) / rate, rel=0.01)
        assert policy.decide(target, 10.000, 10.012, True, True) == (True, 0.0)

    def test_holding_for_headroom_ends_at_max_delay_of_holding(self) -> None:
        policy = _busy_policy(30_000)
        # the oldest event waited 25 ms behind the batch published at 9.995, then 15 ms held by a
        # free scorer: past max_delay in all, but only the hold counts against it
        ready, wait_s = policy.decide(120, oldest=9.970, now=10.010, scorer_free=True, drained=True)
        assert not ready and wait_s == pytest.approx(0.005)
        assert policy.decide(120, 9.970, 10.016, True, True) == (True, 0.0)  # held 21 ms

    def test_holding_for_headroom_ends_within_its_share_of_the_budget(self) -> None:
        policy = _busy_policy(30_000, fixed_s=0.010)
        estimate = policy.cost.estimate(300)
        # waited 40 ms, of which held 5: a hold that would end past half the budget goes now
        oldest = 9.995 + 0.005 - 0.040
        assert 0.040 + estimate > 0.100 * HOLD_BUDGET_SHARE
        assert policy.decide(300, oldest, 10.000, True, True) == (True, 0.0)


def self_policy() -> BatchPolicy:
    return BatchPolicy(max_delay_ms=20, latency_budget_ms=100, cost=_cost(0.003, 10e-6))


def _simulate(
    policy: BatchPolicy, events_per_s: float, fixed_s: float, per_row_s: float, rows: int = 60
) -> tuple[float, float, float]:
    """The loop on a fake clock: one event of ``rows`` rows every ``1 / events_per_s`` seconds,
    each batch processed in ``fixed_s + per_row_s * rows`` on the loop (no overlap), for 20 s.

    Returns:
        The loop's busy share, the worst event latency (s) and the mean events per batch.
    """
    now = busy = worst = 0.0
    arrivals: list[float] = []
    next_at, batches, events = 0.0, 0, 0
    while now < 20.0:
        while next_at <= now:  # what arrived by now joins the open batch
            arrivals.append(next_at)
            next_at += 1 / events_per_s
        oldest = arrivals[0] if arrivals else None
        fit = max(1, policy.row_cap(oldest, now) // rows)
        ready, wait_s = policy.decide(len(arrivals) * rows, oldest, now, True, True)
        if ready or len(arrivals) > fit:
            batch, arrivals = arrivals[:fit], arrivals[fit:]
            policy.closed(len(batch) * rows, batch[0], now)
            seconds = fixed_s + per_row_s * len(batch) * rows
            now += seconds
            busy += seconds
            policy.observe(len(batch) * rows, seconds, now)
            worst = max(worst, now - batch[0])
            batches, events = batches + 1, events + len(batch)
        else:
            # the poll returns at the next arrival or after wait_s (a real clock always moves on)
            now = max(min(now + wait_s, next_at) if math.isfinite(wait_s) else next_at, now + 1e-6)
    return busy / now, worst, events / batches


class TestSimulatedLoop:
    """At half of capacity a free scorer that takes what queued during the last batch keeps the
    loop busy nearly all the time; holding for the headroom rows leaves it idle for a third."""

    @pytest.mark.parametrize(("fixed_s", "per_row_s"), [(0.003, 10e-6), (0.006, 12e-6)])
    def test_half_of_capacity_keeps_headroom_within_the_budget(
        self, fixed_s: float, per_row_s: float
    ) -> None:
        capacity = 4096 / 60 / (fixed_s + per_row_s * 4096)  # events/s at full batches
        busy, worst, per_batch = _simulate(
            BatchPolicy(20, 100, cost=_cost(fixed_s, per_row_s)),
            capacity / 2,
            fixed_s,
            per_row_s,
        )
        assert busy <= 0.7
        assert worst <= 0.100 * HOLD_BUDGET_SHARE + 0.010
        assert per_batch > 1

    def test_a_quiet_loop_closes_small_batches_early(self) -> None:
        busy, worst, per_batch = _simulate(
            BatchPolicy(20, 100, cost=_cost(0.003, 10e-6)), 50, 0.003, 10e-6
        )
        assert per_batch == pytest.approx(1.0)
        assert worst <= 0.003 + 0.0036 + 1e-4  # the fixed-cost hold, then its processing
        assert busy < 0.3
