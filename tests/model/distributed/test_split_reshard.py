"""The default ``split`` plans on real gloo ranks: 4-rank scores equal the single-process model,
and DCP checkpoints reshard 1 -> 4 -> 3 -> 1 across those plans (column-wise on 4 ranks,
row-wise on 3: small_spec's dim 16 splits into 4 columns per rank only for 2 and 4 ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.distributed import describe_plan, export_unsharded, plan_sharding
from model.ranker import build_ranker
from model.store.checkpoint import load_checkpoint, save_checkpoint
from tests.model.conftest import small_spec
from tests.model.distributed.ranks import TOLERANCE, rank_inputs, spawn_ranks
from tests.model.distributed.test_checkpoint import SEED, _chain_worker

SPLIT = ""  # the default config: table-wise tables placed by the split balancer


@pytest.mark.slow
def test_split_plans_match_unsharded_and_reshard_1_to_4_to_3_to_1(tmp_path: Path) -> None:
    spec = small_spec()
    kinds = {
        ws: {
            t.feature: t.sharding_type
            for t in describe_plan(plan_sharding(spec, ws), spec, ws).tables
        }
        for ws in (3, 4)
    }
    assert "column_wise" in kinds[4].values() and "row_wise" in kinds[3].values(), kinds
    ranker = build_ranker(spec, seed=SEED).eval()
    c1, c4, c3, back = (tmp_path / name for name in ("c1", "c4", "c3", "back"))
    save_checkpoint(ranker, spec, c1, model_version="v1")

    spawn_ranks(_chain_worker, 4, SPLIT, str(c1), str(c4), str(tmp_path))
    spawn_ranks(_chain_worker, 3, SPLIT, str(c4), str(c3), str(tmp_path))

    for ws in (4, 3):
        for rank in range(ws):
            res = json.loads((tmp_path / f"{ws}-{rank}.json").read_text())
            assert res["before"] > 1e-3, (ws, rank)  # the fresh sharded model really differed
            assert res["local_diff"] <= TOLERANCE, (ws, rank, res)
            assert res["full_diff"] <= TOLERANCE, (ws, rank, res)
    export_unsharded(c3, back)
    final, _ = load_checkpoint(back)
    _, full = rank_inputs(spec, 4, 0)
    assert float((final.score(full) - ranker.score(full)).abs().max()) <= TOLERANCE
