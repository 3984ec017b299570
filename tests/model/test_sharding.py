"""Tests for model.sharding: plans without a process group, and DMP parity on 2-3 gloo ranks.

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
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from model.features import ModelInput, build_model_input, pad_model_input
from model.ranker import build_ranker
from model.sharding import (
    EBC_MODULE_PATH,
    Balance,
    ShardingConfig,
    ShardingKind,
    TableShardingConfig,
    describe_plan,
    init_distributed,
    local_embedding_bytes,
    plan_sharding,
    shard_ranker,
    sharded_scores,
)
from model.spec import FeatureSpec
from model.synthetic import SyntheticWorld, feature_columns
from tests.model.conftest import SMALL_WORLD, small_spec

TOLERANCE = 1e-5
EVENTS_PER_RANK = 12
ROWS_PER_RANK = 12 * 30  # EVENTS_PER_RANK * SMALL_WORLD.max_candidates: fits any local batch
SPAWN_TIMEOUT_S = 150.0

MIXED_3_RANKS = (
    "table_wise,"
    "user_id=row_wise,"
    "item_id=column_wise,"
    "item_category=data_parallel,"
    "device=table_wise:dense,"
    "country=table_row_wise,"
    "recent_items=table_wise,"
    "balance=planner"
)


# ------------------------------------------------------------------ helpers (also used by DCP)


def free_port() -> int:
    """A TCP port that was free a moment ago (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_ranks(fn: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run ``fn(rank, world_size, port, *args)`` in ``world_size`` spawned processes.

    A failure in any rank is raised here (with the rank's traceback); ranks still running
    after ``SPAWN_TIMEOUT_S`` are killed and the test fails.
    """
    ctx = mp.start_processes(
        fn,
        args=(world_size, free_port(), *args),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    assert ctx is not None
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
            pytest.fail(f"{world_size} ranks did not finish within {SPAWN_TIMEOUT_S:.0f} s")


def start_rank(rank: int, world_size: int, port: int) -> torch.device:
    """Per-rank setup inside a spawned worker: env, one thread, gloo process group."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    return init_distributed(rank, world_size, local_rank=rank, backend="gloo", timeout_s=120)


def finish_rank() -> None:
    """Per-rank teardown after success: barrier, destroy the group, exit without finalization.

    A gloo worker thread may still be destroying a finished collective's work (which holds
    Python-owned tensors) while the interpreter finalizes; the destructor then needs the GIL
    and the process dies with "terminate called without an active exception" (SIGABRT), seen
    here in ~1 of 20 three-rank runs that used object collectives, even after
    destroy_process_group() (pytorch/pytorch#190489). ``os._exit`` skips finalization. Only
    call it on success: a raised exception must reach torch.multiprocessing's error file.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def rank_inputs(spec: FeatureSpec, world_size: int, rank: int) -> tuple[ModelInput, ModelInput]:
    """(this rank's local batch padded to ROWS_PER_RANK rows, the full batch of all ranks)."""
    world = SyntheticWorld(SMALL_WORLD)
    events = world.sample_events(EVENTS_PER_RANK * world_size, np.random.default_rng(21))
    cols = feature_columns(events, world, spec)
    local_cols = cols.slice_events(rank * EVENTS_PER_RANK, (rank + 1) * EVENTS_PER_RANK)
    local = pad_model_input(build_model_input(local_cols, spec), ROWS_PER_RANK)
    return local, build_model_input(cols, spec)


def _first_rows(inp: ModelInput, rows: int) -> ModelInput:
    """The first ``rows`` rows of ``inp`` (every key's bags of those rows)."""
    keys = inp.sparse.keys()
    lengths = inp.sparse.lengths().view(len(keys), inp.num_rows)
    offsets = inp.sparse.offset_per_key()
    starts = [int(offsets[k]) for k in range(len(keys))]
    values = [
        inp.sparse.values()[start : start + int(lengths[k, :rows].sum())]
        for k, start in enumerate(starts)
    ]
    sparse = KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(values),
        lengths=lengths[:, :rows].reshape(-1).contiguous(),
        stride=rows,
    )
    return ModelInput(dense=inp.dense[:rows].contiguous(), sparse=sparse)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


# ---------------------------------------------------------------------------- rank workers


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
        "local_diff": _max_diff(sharded_scores(dmp, local), reference.score(local)),
        "full_diff": _max_diff(sharded_scores(dmp, full), reference.score(full)),
        "local_bytes": local_embedding_bytes(dmp),
        "plan_bytes": report.ranks[rank].bytes,
        "training": dmp.training,
    }
    # Ranks may feed different row counts, even none (the last rank here), but all call.
    rows = 0 if rank == world_size - 1 else local.num_rows - 40 * rank
    uneven = _first_rows(local, rows)
    uneven_scores = sharded_scores(dmp, uneven)
    result["uneven_rows"] = int(uneven_scores.shape[0])
    result["uneven_diff"] = _max_diff(uneven_scores, reference.score(uneven)) if rows else 0.0
    # Different ranks really did score different rows.
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, local.dense[:, 0].sum().item())
    result["distinct_local_batches"] = len(set(gathered)) == world_size
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finish_rank()


def _read_results(out_dir: Path, world_size: int) -> list[dict[str, Any]]:
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world_size)]


# ------------------------------------------------------------------------ planning (no pg)


def test_default_spec_two_ranks_table_wise_bytes() -> None:
    spec = FeatureSpec()
    one = describe_plan(plan_sharding(spec, 1), spec, 1)
    two = describe_plan(plan_sharding(spec, 2), spec, 2)
    full = sum(t.num_embeddings for t in spec.tables) * spec.embedding_dim * 4
    assert one.ranks[0].bytes == full == one.unsharded_bytes == two.unsharded_bytes
    assert sum(r.bytes for r in two.ranks) == full
    assert all(t.sharding_type == "table_wise" and len(t.ranks) == 1 for t in two.tables)
    assert all(t.compute_kernel == "fused" for t in two.tables)
    for rank in two.ranks:
        assert rank.bytes <= 0.6 * one.ranks[0].bytes, two.render()


def test_planner_balance_is_valid_but_not_memory_balanced() -> None:
    spec = FeatureSpec()
    report = describe_plan(
        plan_sharding(spec, 2, config=ShardingConfig(balance=Balance.PLANNER)), spec, 2
    )
    assert all(t.sharding_type == "table_wise" and len(t.ranks) == 1 for t in report.tables)
    assert sum(r.bytes for r in report.ranks) == report.unsharded_bytes
    # Column-wise everywhere splits every table in halves.
    halves = describe_plan(
        plan_sharding(spec, 2, config=ShardingConfig.parse("column_wise")), spec, 2
    )
    assert [r.bytes for r in halves.ranks] == [halves.unsharded_bytes // 2] * 2
    assert all(t.ranks == (0, 1) for t in halves.tables)


def test_mixed_plan_shapes_and_kernels() -> None:
    spec = small_spec()
    plan = plan_sharding(spec, 3, config=ShardingConfig.parse(MIXED_3_RANKS))
    module_plan = plan.plan[EBC_MODULE_PATH]
    report = describe_plan(plan, spec, 3)
    by_feature = {t.feature: t for t in report.tables}
    expect = {
        "user_id": ("row_wise", "fused"),
        "item_id": ("column_wise", "fused"),
        "item_category": ("data_parallel", "dense"),
        "device": ("table_wise", "dense"),
        "country": ("table_row_wise", "fused"),
        "recent_items": ("table_wise", "fused"),
    }
    for feature, (kind, kernel) in expect.items():
        assert (by_feature[feature].sharding_type, by_feature[feature].compute_kernel) == (
            kind,
            kernel,
        ), feature
    # Row-wise shards tile the rows; column-wise shards tile the columns (16 = 2 x 8 on 3 ranks).
    rw = module_plan["t_user_id"].sharding_spec
    assert rw is not None
    assert sorted(s.shard_offsets[0] for s in rw.shards) == [0, 1334, 2668]
    assert sum(s.shard_sizes[0] for s in rw.shards) == spec.tables[0].num_embeddings
    cw = module_plan["t_item_id"].sharding_spec
    assert cw is not None
    assert sorted(s.shard_sizes[1] for s in cw.shards) == [8, 8]
    assert by_feature["item_category"].ranks == (0, 1, 2)
    dp_bytes = 101 * 16 * 4
    assert by_feature["item_category"].bytes_per_rank == {0: dp_bytes, 1: dp_bytes, 2: dp_bytes}
    total_per_rank = [sum(t.bytes_per_rank.get(r, 0) for t in report.tables) for r in range(3)]
    assert [r.bytes for r in report.ranks] == total_per_rank
    # Every table is planned, in spec order.
    assert list(module_plan) == [t.name for t in spec.tables]


def test_explicit_ranks_and_errors() -> None:
    spec = small_spec()
    plan = plan_sharding(
        spec, 3, config=ShardingConfig.parse("table_wise@2,item_id=column_wise@0+1")
    )
    report = describe_plan(plan, spec, 3)
    assert {t.feature: t.ranks for t in report.tables}["item_id"] == (0, 1)
    assert all(t.ranks == (2,) for t in report.tables if t.feature != "item_id")
    with pytest.raises(ValueError, match="unknown tables"):
        plan_sharding(spec, 2, config=ShardingConfig.parse("nope=row_wise"))
    with pytest.raises(ValueError, match="outside world_size"):
        plan_sharding(spec, 2, config=ShardingConfig.parse("table_wise@2"))
    with pytest.raises(ValueError, match="does not split evenly"):
        plan_sharding(spec, 3, config=ShardingConfig.parse("column_wise@0+1+2"))
    with pytest.raises(ValueError, match="dense kernel"):
        TableShardingConfig(ShardingKind.DATA_PARALLEL, compute_kernel="fused")
    with pytest.raises(ValueError, match="unknown sharding type"):
        ShardingConfig.parse("diagonal")
    with pytest.raises(ValueError, match="explicit ranks"):
        TableShardingConfig(ShardingKind.ROW_WISE, ranks=(0, 1))
    with pytest.raises(ValueError, match="world_size"):
        plan_sharding(spec, 0)
    with pytest.raises(ValueError):
        ShardingConfig.parse("table_wise,balance=random")


def test_config_parse_round_trip_and_lookup() -> None:
    cfg = ShardingConfig.parse("data_parallel, user_id=table_wise:dense@1 ,t_item_id=row_wise")
    spec = small_spec()
    assert cfg.default == TableShardingConfig(ShardingKind.DATA_PARALLEL)
    assert cfg.for_table(spec.tables[0]) == TableShardingConfig(
        ShardingKind.TABLE_WISE, "dense", (1,)
    )
    assert cfg.for_table(spec.tables[1]).sharding_type is ShardingKind.ROW_WISE
    assert cfg.for_table(spec.tables[2]).kernel == "dense"
    assert cfg.balance is Balance.BYTES
    assert ShardingConfig.parse("balance=planner").balance is Balance.PLANNER
    assert str(cfg.for_table(spec.tables[0])) == "table_wise:dense@1"
    # Strings are accepted at run time too (e.g. from a CLI or settings file).
    loose = ShardingConfig(default="row_wise")  # type: ignore[arg-type]
    assert loose.default == TableShardingConfig(ShardingKind.ROW_WISE)
    assert TableShardingConfig("row_wise").sharding_type is ShardingKind.ROW_WISE  # type: ignore[arg-type]


def test_report_dict_and_text() -> None:
    spec = small_spec()
    report = describe_plan(plan_sharding(spec, 2), spec, 2)
    data = json.loads(json.dumps(report.as_dict()))
    assert data["world_size"] == 2
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert sum(r["bytes"] for r in data["ranks"]) == report.unsharded_bytes
    assert [t["name"] for t in data["tables"]] == [t.name for t in spec.tables]
    text = report.render()
    assert "t_recent_items" in text and "rank 1:" in text


def test_cuda_plan_needs_no_gpu() -> None:
    spec = small_spec()
    plan = plan_sharding(spec, 4, device_type="cuda", config=ShardingConfig.parse("row_wise"))
    module_plan = plan.plan[EBC_MODULE_PATH]
    assert all(ps.sharding_type == "row_wise" for ps in module_plan.values())
    shards = module_plan["t_item_id"].sharding_spec
    assert shards is not None
    assert {str(s.placement) for s in shards.shards} == {f"rank:{r}/cuda:{r}" for r in range(4)}
    two_hosts = plan_sharding(
        spec, 4, device_type="cuda", config=ShardingConfig.parse("row_wise"), local_world_size=2
    )
    shards = two_hosts.plan[EBC_MODULE_PATH]["t_item_id"].sharding_spec
    assert shards is not None
    assert [str(s.placement) for s in shards.shards] == [
        "rank:0/cuda:0",
        "rank:1/cuda:1",
        "rank:2/cuda:0",
        "rank:3/cuda:1",
    ]
    with pytest.raises(ValueError, match="local_world_size"):
        plan_sharding(spec, 4, local_world_size=3)


def test_shard_ranker_requires_process_group() -> None:
    spec = small_spec()
    with pytest.raises(RuntimeError, match="process group"):
        shard_ranker(spec, plan_sharding(spec, 1), "cpu")


# ------------------------------------------------------------------- multi-rank (spawned)


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
