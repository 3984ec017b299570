"""Run summaries: strict JSON, and one summary of a multi-rank job merged from its ranks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from model.rank import RankContext
from pipeline.jobs.summaries import merge_rank_summaries, write_rank_summary
from pipeline.observability.latency_sketch import RELATIVE_ERROR
from pipeline.observability.summary import RunSummary, json_line


def _no_constant(name: str) -> None:
    raise ValueError(f"not strict JSON: {name}")


def _summary(latencies_ms: list[float], rows_per_event: int = 10) -> RunSummary:
    summary = RunSummary(events_in=len(latencies_ms) + 1, seconds=2.0)
    if latencies_ms:
        summary.first_input_at = 100.0
        summary.record_batch(
            len(latencies_ms),
            rows_per_event * len(latencies_ms),
            np.asarray(latencies_ms, dtype=np.float64) / 1000,
        )
    return summary


def test_a_run_without_events_has_null_latencies_in_strict_json() -> None:
    line = json_line(RunSummary().as_dict())
    parsed = json.loads(line, parse_constant=_no_constant)
    assert parsed["latency_p50_ms"] is None and parsed["latency_p99_ms"] is None
    assert "\n" not in line


def test_json_line_turns_every_non_finite_number_into_null() -> None:
    value = {"a": math.nan, "b": [math.inf, 1.5], "c": {"d": -math.inf}}
    assert json.loads(json_line(value), parse_constant=_no_constant) == {
        "a": None,
        "b": [None, 1.5],
        "c": {"d": None},
    }


def _write_rank(
    directory: Path, monkeypatch: pytest.MonkeyPatch, rank: int, summary: RunSummary, **env: str
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", env.get("restart", "0"))
    context = RankContext(rank=rank, local_rank=rank, world_size=3, local_world_size=3)
    write_rank_summary(directory, summary, context, {"steps": 4.0})


def test_ranks_merge_into_one_summary_with_percentiles_over_every_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = [1.0] * 98  # rank 0: 98 events at 1 ms
    slow = [50.0, 60.0]  # rank 1: 2 events, slow
    _write_rank(tmp_path, monkeypatch, 0, _summary(fast))
    _write_rank(tmp_path, monkeypatch, 1, _summary(slow, rows_per_event=20))
    _write_rank(tmp_path, monkeypatch, 2, _summary([]))  # a rank without input
    merged = merge_rank_summaries(tmp_path)

    assert merged is not None
    assert merged["events_out"] == 100 and merged["rows_scored"] == 98 * 10 + 2 * 20
    assert merged["events_in"] == 99 + 3 + 1 and merged["batches"] == 2
    everything = np.array(fast + slow)
    for key, q in (("latency_p50_ms", 0.5), ("latency_p99_ms", 0.99)):
        assert _close(merged[key], float(np.quantile(everything, q)))
    # not an average of per-rank percentiles: those are 1.0 and 55.0 for p50
    p50s = [r["latency_p50_ms"] for r in merged["ranks"]]
    assert _close(p50s[0], 1.0) and _close(p50s[1], 55.0) and p50s[2] is None
    assert merged["world_size"] == 3 and merged["ranks_reported"] == 3
    assert [r["rank"] for r in merged["ranks"]] == [0, 1, 2]
    assert merged["ranks"][0]["rank_steps"] == {"steps": 4.0}
    assert merged["busy_seconds"] >= max(r["busy_seconds"] for r in merged["ranks"])
    json.loads(json_line(merged), parse_constant=_no_constant)


def test_only_the_last_attempt_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_rank(tmp_path, monkeypatch, 0, _summary([5.0] * 10), restart="0")
    _write_rank(tmp_path, monkeypatch, 1, _summary([5.0] * 10), restart="0")
    _write_rank(tmp_path, monkeypatch, 1, _summary([7.0] * 3), restart="1")
    merged = merge_rank_summaries(tmp_path)
    assert merged is not None
    # rank 1 of the restarted attempt overwrote its file; rank 0's is from the first attempt
    assert [r["rank"] for r in merged["ranks"]] == [1]
    assert merged["events_out"] == 3 and _close(merged["latency_p50_ms"], 7.0)


def test_no_rank_summary_is_none(tmp_path: Path) -> None:
    assert merge_rank_summaries(tmp_path) is None


def test_a_run_summary_counts_every_batch_latency_in_its_sketch() -> None:
    summary = _summary([10.0, 30.0, 20.0])
    summary.record_batch(1, 10, np.array([0.040]))
    assert len(summary.latencies) == 4
    assert _close(summary.as_dict()["latency_p50_ms"], 25.0)
    assert _close(summary.latency_quantile(1.0) * 1000, 40.0)


def _close(reported_ms: float | None, exact_ms: float) -> bool:
    """Within the sketch's bound, and the 0.005 ms of rounding to two decimals."""
    return reported_ms is not None and abs(reported_ms - exact_ms) <= (
        exact_ms * RELATIVE_ERROR + 0.005
    )
