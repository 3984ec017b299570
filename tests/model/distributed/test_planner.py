"""Tests for model.distributed.planner: plans without a process group."""

from __future__ import annotations

import pytest
import torch

from model.distributed import (
    EBC_MODULE_PATH,
    Balance,
    ShardingConfig,
    ShardingKind,
    TableShardingConfig,
    describe_plan,
    plan_sharding,
)
from model.features.spec import FeatureSpec
from tests.model.conftest import small_spec
from tests.model.distributed.ranks import MIXED_3_RANKS


def test_default_spec_two_ranks_table_wise_bytes() -> None:
    spec = FeatureSpec()
    whole = ShardingConfig(balance=Balance.BYTES)
    one = describe_plan(plan_sharding(spec, 1, config=whole), spec, 1)
    two = describe_plan(plan_sharding(spec, 2, config=whole), spec, 2)
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


@pytest.mark.parametrize(
    "config",
    [
        "table_wise",
        "table_wise@3",
        "column_wise",
        "row_wise",
        "table_row_wise",
        "table_column_wise",
        "balance=bytes",
        "balance=planner",
        MIXED_3_RANKS,  # a data-parallel table among them: replicas have no placement
    ],
)
def test_every_cuda_shard_lands_on_the_gpu_its_rank_runs_on(config: str) -> None:
    # Two hosts of two ranks: rank r runs on cuda:{r % 2} (its LOCAL_RANK), whoever places it
    # (the planner or the hand generators).
    spec = small_spec()
    plan = plan_sharding(
        spec, 4, device_type="cuda", config=ShardingConfig.parse(config), local_world_size=2
    )
    placements = [
        shard.placement
        for ps in plan.plan[EBC_MODULE_PATH].values()
        if ps.sharding_spec is not None
        for shard in ps.sharding_spec.shards
    ]
    assert placements
    for placement in placements:
        assert placement is not None
        assert placement.device() == torch.device("cuda", placement.rank() % 2), placement


def test_sequence_tables_are_placed_by_hand_with_their_sharder() -> None:
    from model.module.types import TableConfig

    tables = (
        TableConfig("t_a", 1000, 8, ("a",), module_path="ebc"),
        TableConfig("t_h", 5000, 8, ("h",), ids_per_row=10, module_path="ec", kind="sequence"),
    )
    for text, kind in [("", None), ("h=row_wise", "row_wise"), ("h=table_wise@1", "table_wise")]:
        plan = plan_sharding(tables, 2, config=ShardingConfig.parse(text))
        assert set(plan.plan) == {"ebc", "ec"}
        placed = plan.plan["ec"]["t_h"]  # type: ignore[index]
        assert kind is None or placed.sharding_type == kind
    assert plan.plan["ec"]["t_h"].ranks == [1]  # type: ignore[index]
    for kind in ("data_parallel", "table_column_wise"):
        with pytest.raises(ValueError, match=f"sequence table t_h cannot be {kind}"):
            plan_sharding(tables, 2, config=ShardingConfig.parse(f"h={kind}"))
