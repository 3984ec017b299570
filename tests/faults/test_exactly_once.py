"""Exactly-once mode on the real stack: a ``read_committed`` reader of the output topic sees
every valid event exactly once, across a kill -9 of the pipeline and its restart."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.config import Settings
from tests.faults.measure import report
from tests.integration.conftest import SentEvents, collect, wait_for_outputs

pytestmark = pytest.mark.slow

EXACTLY_ONCE = {
    "STREAMRANK_DELIVERY__GUARANTEE": "exactly_once",
    "STREAMRANK_DELIVERY__COMMIT_INTERVAL_MS": "100",
    "STREAMRANK_BATCHING__MAX_BATCH_ROWS": "64",
}


def test_kill_9_then_restart_read_committed_sees_every_event_once(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
) -> None:
    sent = send_events(pipeline_settings, 6000)
    first = cli(
        pipeline_settings,
        "run",
        extra_env=EXACTLY_ONCE,
        stdout=(tmp_path / "first.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    seen = wait_for_outputs(pipeline_settings, at_least=300)  # records, committed or not
    first.send_signal(signal.SIGKILL)  # mid-transaction
    first.wait(30)
    assert seen < 6000, f"kill came too late ({seen} produced)"

    restarted = time.monotonic()
    second = cli(
        pipeline_settings,
        "run",
        "--exit-when-idle",
        "4",
        extra_env=EXACTLY_ONCE,
        stdout=(tmp_path / "second.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    assert second.wait(300) == 0, (tmp_path / "second.log").read_text()[-3000:]
    recs = collect(pipeline_settings, expected=6000)  # read_committed (librdkafka's default)
    missing, duplicates = report(
        "kill-9", sent.ids, recs, time.monotonic() - restarted, "exactly_once"
    )
    assert missing == 0
    assert duplicates == 0
