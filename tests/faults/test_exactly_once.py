"""Exactly-once mode on the real stack: a ``read_committed`` reader of the output topic sees
every valid event exactly once, across a kill -9 of the pipeline and its restart."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.config import Settings
from tests.faults.helpers import Cli, report, run_until_idle, signal_mid_stream
from tests.integration.conftest import SentEvents, collect

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
    cli: Cli,
) -> None:
    sent = send_events(pipeline_settings, 6000)
    signal_mid_stream(  # mid-transaction
        cli, pipeline_settings, tmp_path / "first.log", EXACTLY_ONCE, signal.SIGKILL, total=6000
    )
    run_s = run_until_idle(cli, pipeline_settings, tmp_path / "second.log", EXACTLY_ONCE)
    recs = collect(pipeline_settings, expected=6000)  # read_committed (librdkafka's default)
    missing, duplicates = report("kill-9", sent.ids, recs, run_s, "exactly_once")
    assert missing == 0
    assert duplicates == 0
