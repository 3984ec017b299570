"""Tests for model.distributed.runtime: DMP parity with the unsharded ranker on 2-3 gloo ranks.

Multi-rank tests spawn real processes (start method ``spawn``, gloo on 127.0.0.1 and a free
port). Each rank builds the same seeded unsharded ranker as a reference, shards it, and scores

- its *own* local batch (different events on each rank, padded to the same row count, as the
  pipeline does), and
- the *full* batch (the same rows on every rank), and
- a prefix of its local batch of a rank-dependent length (the last rank: no rows at all),

comparing each with the unsharded ranker's scores for the same rows. DMP's outputs are
per-rank local: each rank gets the scores of the rows it fed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from model.distributed import ShardingConfig, describe_plan, plan_sharding, shard_ranker
from model.ranker import build_ranker
from model.serving.inference import score_probabilities
from model.serving.memory import embedding_bytes
from tests.model.conftest import small_spec
from tests.model.distributed.ranks import (
    MIXED_3_RANKS,
    ROWS_PER_RANK,
    TOLERANCE,
    finish_rank,
    first_rows,
    max_diff,
    rank_inputs,
    spawn_ranks,
    start_rank,
)


def _parity_worker(rank: int, world_size: int, port: int, config: str, out_dir: str) -> None:
    device = start_rank(rank, world_size, port)
    spec = small_spec()
    reference = build_ranker(spec, seed=7).eval()
    plan = plan_sharding(spec, world_size, config=ShardingConfig.parse(config))
    report = describe_plan(plan, spec, world_size)
    dmp = shard_ranker(reference, plan, device)
    local, full = rank_inputs(spec, world_size, rank)
    result = {
        "rank": rank,
        "local_rows": local.num_rows,
        "local_diff": max_diff(score_probabilities(dmp, local), reference.score(local)),
        "full_diff": max_diff(score_probabilities(dmp, full), reference.score(full)),
        "local_bytes": embedding_bytes(dmp),
        "plan_bytes": report.ranks[rank].bytes,
        "training": dmp.training,
    }
    # Ranks may feed different row counts, even none (the last rank here), but all call.
    rows = 0 if rank == world_size - 1 else local.num_rows - 40 * rank
    uneven = first_rows(local, rows)
    uneven_scores = score_probabilities(dmp, uneven)
    result["uneven_rows"] = int(uneven_scores.shape[0])
    result["uneven_diff"] = max_diff(uneven_scores, reference.score(uneven)) if rows else 0.0
    # Different ranks really did score different rows.
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, local.dense[:, 0].sum().item())
    result["distinct_local_batches"] = len(set(gathered)) == world_size
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finish_rank()


def _read_results(out_dir: Path, world_size: int) -> list[dict[str, Any]]:
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)]


def test_shard_ranker_requires_process_group() -> None:
    spec = small_spec()
    with pytest.raises(RuntimeError, match="process group"):
        shard_ranker(spec, plan_sharding(spec, 1), "cpu")


@pytest.mark.slow
def test_two_ranks_table_wise_match_unsharded(tmp_path: Path) -> None:
    spawn_ranks(_parity_worker, 2, "table_wise", str(tmp_path))
    results = _read_results(tmp_path, 2)
    spec = small_spec()
    unsharded = describe_plan(plan_sharding(spec, 1), spec, 1).unsharded_bytes
    for res in results:
        assert res["local_diff"] <= TOLERANCE, res
        assert res["full_diff"] <= TOLERANCE, res
        assert res["local_bytes"] == res["plan_bytes"] > 0, res
        assert res["local_rows"] == ROWS_PER_RANK
        assert res["distinct_local_batches"] and not res["training"]
        assert res["uneven_diff"] <= TOLERANCE, res
    assert sum(res["local_bytes"] for res in results) == unsharded


@pytest.mark.slow
def test_three_ranks_mixed_plan_match_unsharded(tmp_path: Path) -> None:
    spawn_ranks(_parity_worker, 3, MIXED_3_RANKS, str(tmp_path))
    for res in _read_results(tmp_path, 3):
        assert res["local_diff"] <= TOLERANCE, res
        assert res["full_diff"] <= TOLERANCE, res
        assert res["local_bytes"] == res["plan_bytes"] > 0, res
        assert res["distinct_local_batches"]
        assert res["uneven_diff"] <= TOLERANCE, res
    assert [res["uneven_rows"] for res in _read_results(tmp_path, 3)] == [
        ROWS_PER_RANK,
        ROWS_PER_RANK - 40,
        0,
    ]
