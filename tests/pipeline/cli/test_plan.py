"""``streamrank plan``, run as a user runs it (no servers, no checkpoint needed)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.pipeline.cli.conftest import CliRunner


def test_plan_json_reports_bytes_and_work_per_rank_and_splits_the_big_tables(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    no_checkpoint = {"STREAMRANK_MODEL__CHECKPOINT": str(tmp_path / "none")}
    one = run_cli("plan", "--nproc", "1", "--json", env=no_checkpoint)
    two = run_cli("plan", "--nproc", "2", "--json", env=no_checkpoint)
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.returncode == 0, two.stderr[-2000:]
    one_rank = json.loads(one.stdout.strip().splitlines()[-1])
    two_ranks = json.loads(two.stdout.strip().splitlines()[-1])
    total = one_rank["ranks"][0]["bytes"]
    assert [r["rank"] for r in two_ranks["ranks"]] == [0, 1]
    assert sum(r["bytes"] for r in two_ranks["ranks"]) == total
    assert max(r["bytes"] for r in two_ranks["ranks"]) <= 0.55 * total
    assert sum(r["work"] for r in two_ranks["ranks"]) == one_rank["ranks"][0]["work"] > 0
    balance = two_ranks["balance"]
    assert balance["bytes_ratio"] <= 1.1 and balance["work_ratio"] <= 1.1, balance
    by_feature = {t["feature"]: t["sharding_type"] for t in two_ranks["tables"]}
    assert by_feature["user_id"] == by_feature["recent_items"] == "column_wise", by_feature
    assert by_feature["device"] == "table_wise", by_feature


def test_plan_text_names_every_table_and_rank(run_cli: CliRunner, tmp_path: Path) -> None:
    result = run_cli(
        "plan",
        "--nproc",
        "3",
        env={
            "STREAMRANK_MODEL__CHECKPOINT": str(tmp_path / "none"),
            "STREAMRANK_MODEL__SHARDING__DEFAULT": "table_wise",
            "STREAMRANK_MODEL__SHARDING__TABLES__ITEM_ID__SHARDING_TYPE": "column_wise",
        },
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ("t_user_id", "t_item_id", "t_recent_items", "rank 0", "rank 1", "rank 2"):
        assert name in result.stdout
    assert "column_wise" in result.stdout


def test_bad_sharding_config_is_a_clear_error(run_cli: CliRunner, tmp_path: Path) -> None:
    result = run_cli(
        "plan",
        "--nproc",
        "2",
        env={
            "STREAMRANK_MODEL__CHECKPOINT": str(tmp_path / "none"),
            "STREAMRANK_MODEL__SHARDING__TABLES__ITEM_ID__SHARDING_TYPE": "diagonal_wise",
        },
    )
    assert result.returncode != 0
    assert "diagonal_wise" in result.stderr
