"""The batch policy: score when the scorer is free, hold at most one fixed cost, stay within the
delay cap and the latency budget; the online cost line."""

from __future__ import annotations

import math

import pytest

from pipeline.runtime.batch_policy import BUSY_POLL_S, BatchCost, BatchPolicy


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
        policy = self.policy(fixed_s=0.003, per_row_s=20e-6)
        assert policy.row_cap(None, 10.0) == pytest.approx((0.100 - 0.003) / 20e-6, abs=2)
        assert policy.row_cap(10.0, 10.050) == pytest.approx((0.050 - 0.003) / 20e-6, abs=2)
        # past the budget: still the rows at which the fixed cost is a fifth of the batch
        assert policy.row_cap(10.0, 11.0) == math.ceil(0.003 * 4 / 20e-6)
