"""Tests for pipeline.jobs.summaries.step_stats: a rank's step and collective times."""

from __future__ import annotations

from pathlib import Path

import pytest

from model.rank import RankContext
from pipeline.jobs.summaries import step_stats, summary_path
from pipeline.observability.metrics import STEP_AGREE, Metrics


def test_step_stats_sum_steps_and_collectives() -> None:
    metrics = Metrics(rank=RankContext(rank=1, world_size=2))
    assert step_stats(metrics) == {
        "steps": 0.0,
        "step_seconds": 0.0,
        "step_mean_ms": 0.0,
        "collective_seconds": 0.0,
        "collective_share": 0.0,
    }
    for seconds in (0.010, 0.030):
        metrics.record_step(seconds)
    metrics.record_collective(STEP_AGREE, 0.004)
    metrics.record_collective(STEP_AGREE, 0.006)
    stats = step_stats(metrics)
    assert stats["steps"] == 2
    assert stats["step_seconds"] == pytest.approx(0.04)
    assert stats["step_mean_ms"] == pytest.approx(20.0)
    assert stats["collective_seconds"] == pytest.approx(0.01)
    assert stats["collective_share"] == pytest.approx(0.2)  # 0.01 / (0.04 + 0.01)


def test_under_a_plain_torchrun_each_rank_writes_its_own_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STREAMRANK_RANK_SUMMARIES", raising=False)
    path = Path("run.json")
    assert summary_path(path, RankContext()) == path
    assert summary_path(path, RankContext(rank=0, world_size=2)) == Path("run.rank0.json")
    assert summary_path(path, RankContext(rank=1, world_size=2)) == Path("run.rank1.json")
    assert summary_path(None, RankContext(rank=1, world_size=2)) is None
    monkeypatch.setenv("STREAMRANK_RANK_SUMMARIES", "/tmp/records")  # the launcher merges
    assert summary_path(path, RankContext(rank=1, world_size=2)) is None
