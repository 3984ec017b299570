"""A rank that keeps failing: ``streamrank run --min-nproc`` comes back with fewer ranks
(re-planned, checkpoint resharded) and loses no event (real Kafka and Redis, gloo ranks)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.settings.loading import Settings
from tests.integration.conftest import SentEvents, collect
from tests.support.crash_rank import CRASH_ENV
from tests.support.logs import failure_excerpt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text():
        assert proc.poll() is None, failure_excerpt(path, 4000)
        assert time.monotonic() < deadline, f"no {text!r} in:\n{failure_excerpt(path, 4000)}"
        time.sleep(0.5)


def test_rank_that_keeps_dying_degrades_3_ranks_to_2_without_losing_events(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
) -> None:
    before = send_events(pipeline_settings, 300)
    log_file = tmp_path / "ranks.log"
    proc = cli(
        pipeline_settings,
        "run",
        "--nproc",
        "3",
        "--max-restarts",
        "1",
        "--min-nproc",
        "2",
        "--exit-when-idle",
        "8",
        # The tests-only entry module wraps the real one: rank 2 of every 3-rank attempt
        # exits(1) 3 s after it starts, so torchrun restarts once, gives up, and the launcher
        # degrades to 2 ranks (which it starts through the same module).
        extra_env={CRASH_ENV: "2/3/3", "STREAMRANK_BATCHING__MAX_BATCH_ROWS": "64"},
        module="tests.support.crash_rank",
        stdout=log_file.open("w"),
        stderr=subprocess.STDOUT,
    )
    _wait_for_text(log_file, "degrading to 2 ranks", proc, 500)
    after = send_events(pipeline_settings, 300)  # scored by the 2-rank job only
    assert proc.wait(400) == 0, failure_excerpt(log_file, 4000)

    sent = before.ids | after.ids
    recs = collect(pipeline_settings, expected=len(sent))
    assert {r["event_id"] for r in recs} == sent  # 0 missing (duplicates allowed)
    text = " ".join(log_file.read_text().split())  # the log wraps long lines
    assert text.count("will exit(1)") == 2  # both 3-rank attempts lost rank 2
    assert "running on 2 ranks after 1 degradation(s)" in text, text[-4000:]
    assert "sharding plan for 2 rank(s)" in text  # re-planned for the survivors
