"""The budget account: each published batch matched with its close, charged within or over the
latency budget, with the first cause that explains an overrun."""

from __future__ import annotations

import pytest

from pipeline.runtime.batch_policy import BatchCost, BatchPolicy
from pipeline.runtime.budget_account import MAX_PENDING, BudgetAccount


def test_a_batch_published_within_the_budget_is_not_over() -> None:
    account = BudgetAccount(budget_s=0.100)
    account.closed(1000, oldest=10.000, now=10.020, estimate_s=0.030)
    account.published(1000, seconds=0.030, now=10.055)
    result = account.as_dict()
    assert (result["batches"], result["over_budget"], result["over_budget_share"]) == (1, 0, 0.0)
    assert result["worst_oldest_to_publish_ms"] == pytest.approx(55.0)
    assert result["processing_over_estimate_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("closed_at", "estimate_s", "seconds", "published_at", "cause"),
    [
        # closed after waiting 80 ms with 30 ms of processing expected: over at its close
        (10.080, 0.030, 0.030, 10.112, "closed_late"),
        # closed in time (20 + 30 ms expected) but the processing took 90 ms
        (10.020, 0.030, 0.090, 10.112, "slower_than_estimated"),
        # closed in time, processed as estimated, but it waited 70 ms behind the batch in flight
        (10.020, 0.030, 0.030, 10.120, "queued"),
    ],
)
def test_an_overrun_is_charged_to_its_first_cause(
    closed_at: float, estimate_s: float, seconds: float, published_at: float, cause: str
) -> None:
    account = BudgetAccount(budget_s=0.100)
    account.closed(500, oldest=10.000, now=closed_at, estimate_s=estimate_s)
    account.published(500, seconds=seconds, now=published_at)
    result = account.as_dict()
    assert result["over_budget"] == 1 and result["over_budget_share"] == 1.0
    assert result["over_budget_causes"] == {
        name: int(name == cause) for name in ("closed_late", "slower_than_estimated", "queued")
    }


def test_costs_are_matched_to_their_batch_by_rows_in_order() -> None:
    account = BudgetAccount(budget_s=0.100)
    account.closed(300, oldest=0.0, now=0.01, estimate_s=0.01)  # bisected: never published whole
    account.closed(400, oldest=0.0, now=0.01, estimate_s=0.01)
    account.closed(500, oldest=1.0, now=1.01, estimate_s=0.01)
    account.published(400, seconds=0.01, now=0.2)  # over: the 300-row close is dropped
    account.published(77, seconds=0.01, now=1.02)  # a batch the loop never closed
    account.published(500, seconds=0.01, now=1.03)
    result = account.as_dict()
    assert (result["batches"], result["over_budget"], result["unmatched"]) == (2, 1, 1)
    account.closed(0, oldest=None, now=2.0, estimate_s=0.0)  # an empty close: nothing kept
    account.published(10, seconds=0.01, now=2.0)
    assert account.as_dict()["unmatched"] == 2


def test_memory_stays_bounded_without_costs() -> None:
    account = BudgetAccount(budget_s=0.1)
    for i in range(10 * MAX_PENDING):
        account.closed(i + 1, oldest=0.0, now=0.0, estimate_s=0.01)
    assert len(account._pending) == MAX_PENDING


def test_the_policy_charges_its_budget_with_the_estimate_at_close() -> None:
    cost = BatchCost(fixed_s=0.002, per_row_s=20e-6)
    policy = BatchPolicy(max_delay_ms=20, latency_budget_ms=100, cost=cost)
    estimate = cost.estimate(2000)  # 42 ms
    policy.closed(2000, oldest=5.0, now=5.070)  # 70 + 42 > 100: closed late
    policy.observe(2000, estimate, now=5.070 + estimate)
    result = policy.budget.as_dict()
    assert result["budget_ms"] == 100.0 and result["over_budget_causes"]["closed_late"] == 1
    assert policy.cost.estimate(2000) == pytest.approx(estimate)  # and the cost model learnt it
