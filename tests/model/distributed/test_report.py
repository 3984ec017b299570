"""Tests for model.distributed.report: a plan as a JSON-ready dict and as text."""

from __future__ import annotations

import json

from model.distributed import describe_plan, plan_sharding
from tests.model.conftest import small_spec


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
