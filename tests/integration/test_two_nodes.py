"""One job out of two launchers (``streamrank run --nnodes 2 --node-rank R --rdzv-endpoint``),
here both on this host, 2 ranks each: a 4-rank plan, every event scored exactly once."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.settings.loading import Settings
from tests.integration.conftest import SentEvents, collect
from tests.model.distributed.ranks import free_port
from tests.support.logs import failure_excerpt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_two_nodes_of_two_ranks_score_every_event_exactly_once(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
) -> None:
    sent = send_events(pipeline_settings, 400)
    endpoint = f"127.0.0.1:{free_port()}"
    logs = [tmp_path / f"node{n}.log" for n in range(2)]
    nodes = [
        cli(
            pipeline_settings,
            "run",
            "--nproc",
            "2",
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--rdzv-endpoint",
            endpoint,
            "--max-restarts",
            "0",
            "--exit-when-idle",
            "4",
            "--summary-json",
            str(tmp_path / f"node{node}.json"),
            stdout=logs[node].open("w"),
            stderr=subprocess.STDOUT,
        )
        for node in range(2)
    ]
    for node, proc in enumerate(nodes):
        assert proc.wait(480) == 0, failure_excerpt(logs[node], 4000)

    recs = collect(pipeline_settings, expected=400)
    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == sent.ids
    assert max(counts.values()) == 1  # exactly once in a clean run
    assert "sharding plan for 4 rank(s)" in logs[0].read_text()  # rank 0 lives on node 0
    # Global ranks 0..3: each node's summary merges its own ranks (0-1 on node 0, 2-3 on 1).
    jobs = [json.loads((tmp_path / f"node{n}.json").read_text()) for n in range(2)]
    assert [[r["rank"] for r in job["ranks"]] for job in jobs] == [[0, 1], [2, 3]]
    assert all(job["world_size"] == 4 and job["ranks_reported"] == 2 for job in jobs)
    assert sum(job["events_out"] for job in jobs) == 400
    assert sorted(p.name for p in tmp_path.glob("node*.json")) == ["node0.json", "node1.json"]
