"""Tests for model.distributed.config: the per-table sharding config and its string form."""

from __future__ import annotations

from model.distributed import Balance, ShardingConfig, ShardingKind, TableShardingConfig
from tests.model.conftest import small_spec


def test_config_parse_round_trip_and_lookup() -> None:
    cfg = ShardingConfig.parse("data_parallel, user_id=table_wise:dense@1 ,t_item_id=row_wise")
    spec = small_spec()
    assert cfg.default == TableShardingConfig(ShardingKind.DATA_PARALLEL)
    assert cfg.for_table(spec.tables[0]) == TableShardingConfig(
        ShardingKind.TABLE_WISE, "dense", (1,)
    )
    assert cfg.for_table(spec.tables[1]).sharding_type is ShardingKind.ROW_WISE
    assert cfg.for_table(spec.tables[2]).kernel == "dense"
    assert cfg.balance is Balance.SPLIT
    assert ShardingConfig.parse("balance=planner").balance is Balance.PLANNER
    assert str(cfg.for_table(spec.tables[0])) == "table_wise:dense@1"
    # Strings are accepted at run time too (e.g. from a CLI or settings file).
    loose = ShardingConfig(default="row_wise")  # type: ignore[arg-type]
    assert loose.default == TableShardingConfig(ShardingKind.ROW_WISE)
    assert TableShardingConfig("row_wise").sharding_type is ShardingKind.ROW_WISE  # type: ignore[arg-type]
