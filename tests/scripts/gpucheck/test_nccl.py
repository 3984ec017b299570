"""Tests for scripts.gpucheck.nccl.run_ranks: rank children are polled, never waited out.

The children (:mod:`tests.scripts.gpucheck.fake_ranks`) stand in for NCCL ranks (no GPU
here): one that crashes leaves its peer stuck as in a collective, and the wait must end with
the crash, not with the timeout.
"""

from __future__ import annotations

from scripts.gpucheck.nccl import run_ranks
from tests.scripts.gpucheck import fake_ranks
from tests.scripts.gpucheck.fake_ranks import LONG


def test_every_rank_reports() -> None:
    ranks, error = run_ranks(fake_ranks.report, 2, (), LONG)
    assert error is None
    assert ranks == [{"rank": 0, "max_abs_diff": 0.0}, {"rank": 1, "max_abs_diff": 0.0}]


def test_a_crashed_rank_ends_the_wait_and_its_peer_is_killed() -> None:
    ranks, error = run_ranks(fake_ranks.first_crashes, 2, (), LONG)
    assert ranks == [] and error == "rank 0 exited with code 3 before reporting"


def test_a_failing_rank_ends_the_wait() -> None:
    ranks, error = run_ranks(fake_ranks.second_fails, 2, (), LONG)
    assert error == "rank 1 failed: RuntimeError: NCCL error"
    assert ranks == [{"rank": 1, "error": "RuntimeError: NCCL error"}]


def test_the_time_limit_holds_when_no_rank_answers() -> None:
    ranks, error = run_ranks(fake_ranks.both_hang, 2, (), 1.0)
    assert ranks == [] and error == "no result from ranks [0, 1] within 1.0 s"
