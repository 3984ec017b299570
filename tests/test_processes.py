"""The session's leftover-process check (tests/processes.py, hooked in tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import LEFTOVER_GRACE_ENV, REPO_ROOT
from tests.processes import SESSION_ENV, TREE_ENV, kill_marked, marked, new_marker

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _found(marker: str, pid: int) -> bool:
    """Whether ``marked`` finds ``pid`` within a minute (a process that has just exec'd shows
    an empty environment until the kernel has set up its stack)."""
    deadline = time.monotonic() + 60
    while marked(TREE_ENV, marker) != [pid]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_only_processes_with_our_marker_count() -> None:
    ours, theirs = new_marker(), new_marker()
    sleepers = {
        marker: subprocess.Popen(["sleep", "600"], env={**os.environ, TREE_ENV: marker})
        for marker in (ours, theirs)
    }
    try:
        assert _found(ours, sleepers[ours].pid)
        assert _found(theirs, sleepers[theirs].pid)
        assert kill_marked(TREE_ENV, ours) == [sleepers[ours].pid]
        sleepers[ours].wait(30)
        assert marked(TREE_ENV, ours) == []
        assert sleepers[theirs].poll() is None  # another session's process is left alone
    finally:
        for proc in sleepers.values():
            proc.kill()
            proc.wait(30)


LEAKY_TEST = """
import subprocess

def test_leaves_a_process_behind():
    subprocess.Popen(["sleep", "600"], start_new_session=True)
"""

TIDY_TEST = """
import subprocess

def test_stops_what_it_starts():
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    proc.kill()
    proc.wait()
"""


def _inner_session(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of its own, with this suite's session hooks, on one test file."""
    (tmp_path / "test_inner.py").write_text(source)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "test_inner.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), LEFTOVER_GRACE_ENV: "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_session_that_leaves_a_process_alive_fails_and_kills_it(tmp_path: Path) -> None:
    done = _inner_session(tmp_path, LEAKY_TEST)
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "outlived it (killed now)" in done.stdout and "sleep 600" in done.stdout
    leaked = int(done.stdout.split("outlived it (killed now):")[1].split()[0])
    # It was killed: only a zombie (or nothing) is left of it, reaped by init.
    assert leaked not in marked(SESSION_ENV, os.environ[SESSION_ENV])
    assert (
        not Path(f"/proc/{leaked}/cmdline").exists()
        or not Path(f"/proc/{leaked}/cmdline").read_bytes()
    )


def test_a_tidy_session_passes(tmp_path: Path) -> None:
    done = _inner_session(tmp_path, TIDY_TEST)
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    assert "outlived" not in done.stdout
