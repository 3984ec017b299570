"""Tests for pipeline.distributed: a rank's step and collective times, its sharding plan."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from model.spec import FeatureSpec
from pipeline import distributed
from pipeline.config import Settings
from pipeline.distributed import step_stats
from pipeline.metrics import STEP_AGREE, Metrics


def test_step_stats_sum_steps_and_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    metrics = Metrics()
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


class _Planned(Exception):
    """Raised by the fake planner: the test ends once the rank has planned."""


def test_a_rank_plans_its_shards_onto_the_gpus_of_its_own_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two hosts with two GPUs each: rank 3 is LOCAL_RANK 1 and runs on cuda:1, so the plan
    # must place its shards there (rank % local_world_size), not on cuda:3 (rank % world_size).
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(distributed, "join_process_group", lambda: torch.device("cuda", 1))
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 3)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(distributed.dist, "new_group", lambda **_: None)
    monkeypatch.setattr(distributed, "load_meta", lambda _: SimpleNamespace(spec=FeatureSpec()))
    planned: dict[str, Any] = {}

    def plan(*args: Any, **kwargs: Any) -> None:
        planned.update(kwargs, args=args)
        raise _Planned

    monkeypatch.setattr(distributed, "plan_sharding", plan)
    with pytest.raises(_Planned):
        distributed.run_rank(Settings(), None, None)
    assert planned["args"][1:3] == (4, "cuda")
    assert planned["local_world_size"] == 2
