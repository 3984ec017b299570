"""The sharded strategy plans with the rank's own host: shards on ``cuda:{LOCAL_RANK}``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from model.features.spec import FeatureSpec
from model.rank import RankContext
from model.ranker import builtin_module_config
from model.serving import ServingOptions, sharded
from model.serving.served import ServedModule


class _Planned(Exception):
    """Raised by the fake planner: the test ends once the rank has planned."""


def test_a_rank_plans_its_shards_onto_the_gpus_of_its_own_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two hosts with two GPUs each: rank 3 is LOCAL_RANK 1 and runs on cuda:1, so the plan
    # must place its shards there (rank % local_world_size), not on cuda:3 (rank % world_size).
    joined: dict[str, Any] = {}
    monkeypatch.setattr(sharded, "join_process_group", lambda *a, **k: joined.update(k, args=a))
    spec = FeatureSpec()
    served = ServedModule(builtin_module_config(spec), spec.input_layout(), "v1", spec)
    planned: dict[str, Any] = {}

    def plan(*args: Any, **kwargs: Any) -> None:
        planned.update(kwargs, args=args)
        raise _Planned

    monkeypatch.setattr(sharded, "plan_sharding", plan)
    rank = RankContext(rank=3, local_rank=1, world_size=4, local_world_size=2)
    with pytest.raises(_Planned):
        sharded.load_sharded_model(ServingOptions(Path("m")), served, torch.device("cuda", 1), rank)
    assert joined["args"] == (3, 4, 1) and joined["backend"] == "nccl"
    assert planned["args"][1:3] == (4, "cuda")
    assert planned["local_world_size"] == 2
