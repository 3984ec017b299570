"""Sharded ranker across ranks (torchrun, gloo on CPU) against the real Kafka and Redis."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from model.spec import FeatureSpec
from model.synthetic import SyntheticWorld
from pipeline.config import Settings
from tests.integration.conftest import (
    SentEvents,
    collect,
    max_score_error,
    offline_scores,
    wait_for_outputs,
)

# torchrun starts, kills and restarts ranks: the slowest tests of the suite.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _no_constant(name: str) -> None:
    raise ValueError(f"not strict JSON: {name}")


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def _rank_pids(launcher_pid: int) -> list[int]:
    """Worker processes under torchrun (their environment has RANK set)."""
    ranks = []
    for pid in _descendants(launcher_pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(v.startswith(b"RANK=") for v in environ):
            ranks.append(pid)
    return ranks


@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_score_every_event_once_with_the_offline_scores(
    nproc: int,
    pipeline_settings: Settings,
    spec: FeatureSpec,
    world: SyntheticWorld,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
) -> None:
    sent = send_events(pipeline_settings, 400)
    log_file = tmp_path / "ranks.log"
    proc = cli(
        pipeline_settings,
        "run",
        "--nproc",
        str(nproc),
        "--exit-when-idle",
        "4",
        "--summary-json",
        str(tmp_path / "summary.json"),
        # 3 ranks also run each forward on the scoring thread while the loop goes on (its
        # control all_reduce then runs alongside the forward's collectives, on its own group).
        extra_env={"STREAMRANK_BATCHING__OVERLAP_FORWARD": str(nproc == 3).lower()},
        stdout=log_file.open("w"),
        stderr=subprocess.STDOUT,
    )
    assert proc.wait(300) == 0, log_file.read_text()[-4000:]

    recs = collect(pipeline_settings, expected=400)
    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == sent.ids
    assert max(counts.values()) == 1
    offline = offline_scores(sent, world, spec, pipeline_settings.model.checkpoint)
    assert max_score_error(recs, offline) <= 1e-5
    # One summary of the job, merged over every rank (no per-rank files to find) ...
    job = json.loads((tmp_path / "summary.json").read_text())
    assert [r["rank"] for r in job["ranks"]] == list(range(nproc))
    assert job["world_size"] == job["ranks_reported"] == nproc
    assert job["events_out"] == sum(r["events_out"] for r in job["ranks"]) == 400
    assert job["rows_scored"] == sum(r["rows_scored"] for r in job["ranks"])
    assert job["latency_p50_ms"] is not None and job["latency_p99_ms"] >= job["latency_p50_ms"]
    assert sorted(p.name for p in tmp_path.glob("summary*")) == ["summary.json"]
    # ... and it is the last line of the log: strict JSON.
    log_text = log_file.read_text()
    assert json.loads(log_text.splitlines()[-1], parse_constant=_no_constant) == job
    assert "sharding plan" in log_text
    # Third-party noise is filtered: torchrun's OMP banner, TorchRec's and torch's notices.
    for noise in ("OMP_NUM_THREADS", "broadcast_buffers", "is_fx_tracing"):
        assert noise not in log_text


def test_killing_a_rank_restarts_the_ranks_without_losing_events(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
) -> None:
    sent = send_events(pipeline_settings, 6000)
    log_file = tmp_path / "ranks.log"
    proc = cli(
        pipeline_settings,
        "run",
        "--nproc",
        "2",
        "--max-restarts",
        "2",
        "--exit-when-idle",
        "6",
        extra_env={"STREAMRANK_BATCHING__MAX_BATCH_ROWS": "64"},
        stdout=log_file.open("w"),
        stderr=subprocess.STDOUT,
    )
    seen = wait_for_outputs(pipeline_settings, at_least=300)
    ranks = _rank_pids(proc.pid)
    assert len(ranks) == 2, ranks
    os.kill(max(ranks), signal.SIGKILL)
    assert 300 <= seen < 6000, f"kill came too late ({seen} scored)"

    assert proc.wait(300) == 0, log_file.read_text()[-4000:]
    recs = collect(pipeline_settings, expected=6000)
    assert {r["event_id"] for r in recs} == sent.ids  # nothing lost
    assert len(recs) >= 6000
    log_text = log_file.read_text()
    assert "exitcode: -9" in log_text  # torchrun saw the kill ...
    assert log_text.count("sharding plan") >= 2  # ... and started the ranks again


def test_sigterm_stops_all_ranks_together_and_a_restart_loses_nothing(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
) -> None:
    sent = send_events(pipeline_settings, 4000)
    small_batches = {"STREAMRANK_BATCHING__MAX_BATCH_ROWS": "64"}
    first = cli(
        pipeline_settings,
        "run",
        "--nproc",
        "2",
        extra_env=small_batches,
        stdout=(tmp_path / "first.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    seen = wait_for_outputs(pipeline_settings, at_least=300)
    assert 300 <= seen < 4000, f"stop came too late ({seen} scored)"
    os.killpg(first.pid, signal.SIGTERM)  # what an orchestrator does to the whole job
    first.wait(90)  # no collective left hanging: every rank reaches the agreed stop

    second = cli(
        pipeline_settings,
        "run",
        "--nproc",
        "2",
        "--exit-when-idle",
        "5",
        stdout=(tmp_path / "second.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    assert second.wait(300) == 0, (tmp_path / "second.log").read_text()[-4000:]
    recs = collect(pipeline_settings, expected=4000)
    assert {r["event_id"] for r in recs} == sent.ids
