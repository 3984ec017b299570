"""Tests for pipeline.jobs.lifetime: children die with their parent (prctl PR_SET_PDEATHSIG), also
when the parent died before the child was bound."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.jobs.lifetime import LAUNCHER_PID_ENV, children, parent_of, set_parent_death_signal
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def _gone(pid: int, timeout_s: float = 30.0) -> bool:
    """Whether ``pid`` exits (or is a zombie) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_children_and_parent_of_read_the_process_table() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in children(os.getpid())
        assert parent_of(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert parent_of(child.pid) is None


def test_a_child_started_with_the_preexec_dies_when_its_parent_is_killed(tmp_path: Path) -> None:
    # parent: starts a long sleep bound to itself, writes its pid, then waits forever.
    code = (
        "import subprocess, sys, time; from pipeline.jobs.lifetime import preexec_die_with_parent; "
        "child = subprocess.Popen(['sleep', '600'], preexec_fn=preexec_die_with_parent()); "
        "open(sys.argv[1], 'w').write(str(child.pid)); time.sleep(600)"
    )
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", code, str(pid_file)], env=ENV)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert parent_of(child) == parent.pid
        parent.kill()
        parent.wait(30)
        assert _gone(child), "the child outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)


def _bind_rank(launcher_pid: int | None) -> subprocess.CompletedProcess[str]:
    """Runs ``bind_rank_to_launcher`` in a grandchild of this process (the test plays the
    launcher, an intermediate python plays torchrun's agent)."""
    rank = (
        "from pipeline.jobs.lifetime import bind_rank_to_launcher; "
        "bind_rank_to_launcher(); print('bound')"
    )
    agent = (
        "import subprocess, sys; "
        f"r = subprocess.run([sys.executable, '-c', {rank!r}]); sys.exit(r.returncode % 256)"
    )
    env = {k: v for k, v in ENV.items() if k != LAUNCHER_PID_ENV}
    if launcher_pid is not None:
        env[LAUNCHER_PID_ENV] = str(launcher_pid)
    return subprocess.run(
        [sys.executable, "-c", agent], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_rank_binds_when_the_chain_up_to_the_launcher_is_whole() -> None:
    done = _bind_rank(os.getpid())
    assert done.returncode == 0 and done.stdout.strip() == "bound", done.stderr
    done = _bind_rank(None)  # torchrun started by hand: bound to the agent only
    assert done.returncode == 0 and done.stdout.strip() == "bound", done.stderr


def test_a_rank_whose_launcher_is_already_gone_stops_at_once() -> None:
    # The launcher named in the environment is not the agent's parent any more.
    done = _bind_rank(1)
    assert done.returncode == (-signal.SIGKILL) % 256, done.stdout + done.stderr
    assert "bound" not in done.stdout
    assert "launcher or torchrun's agent is gone" in done.stderr


def test_the_death_signal_can_be_set_and_cleared() -> None:
    assert set_parent_death_signal(signal.SIGTERM)
    assert set_parent_death_signal(0)  # pytest's own process: leave it unbound
