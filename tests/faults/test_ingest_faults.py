"""Faults with ingest workers (``batching.ingest_workers = 2``) on the real stack (``pytest -s``
prints the measured lines):

- SIGTERM to the process mid-stream: every worker finishes its open batch and commits, the
  process exits 0 within the shutdown timeout; a restart scores the rest; nothing lost, nothing
  twice;
- SIGKILL of one worker mid-stream: the process stops the other one and exits non-zero, and no
  process of the run is left; a restart scores the rest (at-least-once: nothing lost, and only
  the two workers' uncommitted batches repeat);
- exactly-once: SIGKILL of one worker inside its open transaction, then a restart: a
  ``read_committed`` reader sees every event exactly once (each worker has its own
  ``transactional.id``; the restarted worker fences its predecessor's transaction).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.settings.loading import Settings
from tests.faults.helpers import (
    FAST_COMMITS,
    Cli,
    audit_exactly_once,
    committed_positions,
    members_with_partitions,
    open_transaction_records,
    restart_and_report,
    run_until_idle,
    signal_run,
    start_run,
    uncommitted_outputs,
    wait_until,
)
from tests.integration.conftest import SentEvents, collect, produced_count
from tests.processes import descendants, gone
from tests.support.logs import failure_excerpt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TWO_WORKERS = {
    "STREAMRANK_BATCHING__INGEST_WORKERS": "2",
    "STREAMRANK_BATCHING__MAX_BATCH_ROWS": "64",  # many commits, slow enough to stop mid-stream
}
EXACTLY_ONCE = {
    **TWO_WORKERS,
    "STREAMRANK_DELIVERY__GUARANTEE": "exactly_once",
    "STREAMRANK_DELIVERY__COMMIT_INTERVAL_MS": "2000",  # a kill lands inside a transaction
    "STREAMRANK_BATCHING__MAX_IN_FLIGHT_BATCHES": "64",
}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def worker_pids(run_pid: int) -> list[int]:
    """The ingest workers of a ``streamrank run`` process (spawned by multiprocessing)."""
    return [pid for pid in descendants(run_pid) if "spawn_main" in _cmdline(pid)]


def both_workers_consuming(proc: subprocess.Popen, settings: Settings) -> list[int]:
    """The two ingest workers of ``proc``, once both own input partitions."""
    workers = worker_pids(proc.pid)
    assert len(workers) == 2
    wait_until(
        lambda: members_with_partitions(settings) == 2, "both workers consuming", timeout_s=300.0
    )
    return workers


def test_sigterm_stops_every_worker_in_time_and_a_restart_loses_or_repeats_nothing(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Cli,
) -> None:
    sent = send_events(pipeline_settings, 4000)
    env = {**TWO_WORKERS, "STREAMRANK_SHUTDOWN__TIMEOUT_S": "10"}
    log = tmp_path / "first.log"
    proc = start_run(cli, pipeline_settings, log, env)
    workers = both_workers_consuming(proc, pipeline_settings)
    exit_s = signal_run(proc, pipeline_settings, log, signal.SIGTERM, total=4000)
    assert exit_s < 10.0 + 3.0, f"exit took {exit_s:.1f}s"
    assert all(gone(pid, timeout_s=5) for pid in workers)
    text = log.read_text()
    assert "[w0]: signal 15" in text and "[w1]: signal 15" in text  # both were told
    assert "killing them" not in text  # both finished in time

    second = tmp_path / "second.log"
    missing, duplicates, run_s = restart_and_report(
        cli, pipeline_settings, second, TWO_WORKERS, sent.ids, "ingest-sigterm", recover_s=exit_s
    )
    print(f"RELIABILITY ingest-sigterm restart_s={run_s:.1f}")
    logs = f"first run:\n{failure_excerpt(log)}\nrestart:\n{failure_excerpt(second)}"
    assert missing == 0, logs
    assert duplicates == 0, logs  # SIGTERM commits everything it produced


def test_a_killed_worker_fails_the_run_leaves_no_process_and_a_restart_loses_nothing(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Cli,
) -> None:
    sent = send_events(pipeline_settings, 4000)
    log = tmp_path / "first.log"
    env = {**TWO_WORKERS, **FAST_COMMITS}
    proc = start_run(cli, pipeline_settings, log, env)
    tree = descendants(proc.pid)
    workers = worker_pids(proc.pid)
    assert len(workers) == 2 and len(tree) >= 3  # two workers and the resource tracker
    assert produced_count(pipeline_settings) < 4000, "the kill came too late"
    os.kill(workers[0], signal.SIGKILL)
    code = proc.wait(60)
    assert code == 1, failure_excerpt(log)
    assert all(gone(pid, timeout_s=10) for pid in tree), "a process of the run outlived it"
    text = log.read_text()
    assert "ingest worker 0 exited with code -9: stopping the other workers" in text
    assert "IngestWorkerFailed" in text

    killed_run = collect(pipeline_settings, expected=0)  # every process of the run is gone
    committed = committed_positions(pipeline_settings)  # where the restart resumes
    repeats = uncommitted_outputs(pipeline_settings, killed_run, committed)
    missing, duplicates, _ = restart_and_report(
        cli, pipeline_settings, tmp_path / "second.log", TWO_WORKERS, sent.ids,
        "ingest-worker-kill-9",
    )  # fmt: skip
    assert missing == 0
    # Exactly the run's produced but uncommitted events repeat: the killed worker's, and the
    # other's (stopped without the scoring server); at most 264 events unless the host delayed
    # the commit requests (RELIABILITY.md, "What a kill -9 can repeat").
    assert duplicates == len(repeats)
    assert committed, "the run committed nothing"


def test_exactly_once_with_two_workers_across_a_killed_worker_each_event_once(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Cli,
) -> None:
    ids = send_events(pipeline_settings, 3500).ids
    log = tmp_path / "killed.log"
    proc = start_run(cli, pipeline_settings, log, EXACTLY_ONCE)
    workers = both_workers_consuming(proc, pipeline_settings)
    # A fast machine may have scored the first events by now: keep the input flowing until a
    # transaction is seen open, so the kill lands inside one.
    deadline = time.monotonic() + 300.0
    while open_transaction_records(pipeline_settings) == 0:
        assert time.monotonic() < deadline, "never happened: an open transaction"
        assert proc.poll() is None, failure_excerpt(log)
        ids |= send_events(pipeline_settings, 100).ids
    os.kill(workers[1], signal.SIGKILL)  # its open transaction stays open
    assert proc.wait(60) == 1, failure_excerpt(log)

    run_s = run_until_idle(cli, pipeline_settings, tmp_path / "second.log", EXACTLY_ONCE)
    missing, duplicates, aborted = audit_exactly_once(
        "ingest-exactly-once-worker-kill-9", pipeline_settings, ids, run_s
    )
    assert missing == 0
    assert duplicates == 0
    print(f"RELIABILITY ingest-exactly-once aborted={aborted}")
