"""Tests for model.distributed.balance and the default ``split`` plans: bytes and lookup work
per rank within 1.1x of the ideal for 2..8 ranks."""

from __future__ import annotations

import pytest

from model.distributed import ShardingConfig, describe_plan, plan_sharding
from model.distributed.balance import split_kind, split_placement
from model.distributed.config import ShardingKind
from model.distributed.cost import table_load
from model.features.spec import FeatureSpec

BIG_USER = FeatureSpec.from_settings({"num_embeddings": {"user_id": 10_000_000}})


@pytest.mark.parametrize("spec", [FeatureSpec(), BIG_USER], ids=["default", "user10M"])
@pytest.mark.parametrize("world_size", range(2, 9))
def test_split_plan_balances_bytes_and_work(spec: FeatureSpec, world_size: int) -> None:
    report = describe_plan(plan_sharding(spec, world_size), spec, world_size)
    one = describe_plan(plan_sharding(spec, 1), spec, 1)
    assert sum(r.bytes for r in report.ranks) == one.ranks[0].bytes == report.unsharded_bytes
    assert sum(r.work for r in report.ranks) == pytest.approx(one.ranks[0].work)
    assert report.bytes_ratio <= 1.1, report.render()
    assert report.work_ratio <= 1.1, report.render()


def test_whole_tables_cannot_balance_what_split_does() -> None:
    spec = FeatureSpec()
    whole = describe_plan(
        plan_sharding(spec, 8, config=ShardingConfig.parse("balance=bytes")), spec, 8
    )
    assert whole.bytes_ratio > 3.5  # the user table is half of all bytes
    split = describe_plan(plan_sharding(spec, 8), spec, 8)
    assert split.max_rank_bytes * 3.5 < whole.max_rank_bytes


def test_work_measure_counts_pooling_and_column_shards() -> None:
    spec = FeatureSpec()
    user, recent = spec.table_configs()[0], spec.table_configs()[-1]
    assert user.ids_per_row == 1
    assert recent.ids_per_row == spec.recent_items_cap == 20
    assert table_load(recent) == (100_000 * 64 * 4, 20 * 64 * 4)
    report = describe_plan(plan_sharding(spec, 4), spec, 4)
    recent_plan = next(t for t in report.tables if t.feature == "recent_items")
    assert recent_plan.sharding_type == "column_wise"
    # Every column shard does all 20 lookups per row on its 16 columns.
    assert recent_plan.work_per_rank == dict.fromkeys(range(4), 20 * 16 * 4)


def test_small_tables_stay_whole_and_split_kind_follows_the_dim() -> None:
    spec = FeatureSpec()
    placed = split_placement(spec.table_configs(), 2)
    assert placed.max_ratio <= 1.1
    assert "t_device" in placed.whole and "t_user_id" in placed.split
    assert split_kind(64, 2) is ShardingKind.COLUMN_WISE
    assert split_kind(64, 8) is ShardingKind.COLUMN_WISE
    assert split_kind(64, 3) is ShardingKind.ROW_WISE
    assert split_placement(spec.table_configs(), 1).split == frozenset()


def test_split_balances_around_explicit_overrides() -> None:
    spec = FeatureSpec()
    cfg = ShardingConfig.parse("table_wise,user_id=table_wise@0,item_id=column_wise@2+3")
    plan = plan_sharding(spec, 4, config=cfg)
    report = describe_plan(plan, spec, 4)
    by_feature = {t.feature: t for t in report.tables}
    assert (
        by_feature["user_id"].ranks == (0,) and by_feature["user_id"].sharding_type == "table_wise"
    )
    assert by_feature["item_id"].ranks == (2, 3)
    # Rank 0 holds the whole user table (half of all bytes, pinned there): the tables placed
    # whole go elsewhere, and the lookup work still balances.
    for feature in ("item_category", "device", "country"):
        assert 0 not in by_feature[feature].ranks, report.render()
    assert report.work_ratio <= 1.1, report.render()
    assert report.bytes_ratio > 2.0  # the pinned table alone is 2x a quarter
