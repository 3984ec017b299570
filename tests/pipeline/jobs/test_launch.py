"""Tests for pipeline.jobs.launch: torchrun command lines, the degrading supervisor, signals passed
on to
the ranks, ranks dying with the launcher, the test hook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from pipeline.jobs.launch import (
    DEGRADATIONS_ENV,
    Launch,
    start_torchrun,
    supervise,
    torchrun_command,
)
from pipeline.jobs.lifetime import parent_of
from tests.conftest import REPO_ROOT


def _option(command: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in command if a.startswith(name + "="))


def test_torchrun_command_one_node_and_several() -> None:
    one = torchrun_command(Launch(3, max_restarts=1), ["run", "-c", "x.toml"])
    assert one[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in one and _option(one, "--nproc-per-node") == "3"
    assert _option(one, "--max-restarts") == "1"
    assert one[-5:] == ["-m", "pipeline.cli", "run", "-c", "x.toml"]
    two = torchrun_command(
        Launch(2, max_restarts=0, nnodes=2, node_rank=1, rdzv_endpoint="h:29400"), ["run"], 1
    )
    assert "--standalone" not in two
    assert _option(two, "--nnodes") == "2" and _option(two, "--node-rank") == "1"
    assert _option(two, "--rdzv-endpoint") == "h:29400"
    assert _option(two, "--rdzv-backend") == "static"
    assert _option(two, "--nproc-per-node") == "1"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"nproc": 2, "min_nproc": 3}, "min-nproc"),
        ({"nproc": 2, "min_nproc": 0}, "min-nproc"),
        ({"nproc": 2, "nnodes": 2}, "rdzv-endpoint"),
        ({"nproc": 2, "nnodes": 2, "rdzv_endpoint": "h:1", "node_rank": 2}, "node-rank"),
        ({"nproc": 2, "nnodes": 2, "rdzv_endpoint": "h:1", "min_nproc": 1}, "one node"),
        ({"nproc": 0}, "nproc"),
        ({"nproc": 2, "nnodes": 2, "rdzv_endpoint": "h"}, "HOST:PORT"),
        ({"nproc": 2, "nnodes": 2, "rdzv_endpoint": "h:"}, "HOST:PORT"),
        ({"nproc": 2, "nnodes": 2, "rdzv_endpoint": ":29400"}, "HOST:PORT"),
        ({"nproc": 2, "nnodes": 2, "rdzv_endpoint": "h:0"}, "1..65535"),
        ({"nproc": 2, "nnodes": 2, "rdzv_endpoint": "h:65536"}, "1..65535"),
    ],
)
def test_bad_launch_options(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Launch(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("endpoint", ["10.0.0.5:29400", "node-0.cluster:1", "[::1]:29400"])
def test_rdzv_endpoints_with_a_port(endpoint: str) -> None:
    assert Launch(2, nnodes=2, rdzv_endpoint=endpoint).rdzv_endpoint == endpoint


class _Done:
    """A torchrun that has already exited with ``status``."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.pid = -1

    def wait(self, timeout: float | None = None) -> int:
        return self.status

    def send_signal(self, sig: int) -> None:
        raise AssertionError("nothing to signal")

    def kill(self) -> None:
        raise AssertionError("nothing to kill")


class _FakeTorchrun:
    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.calls: list[tuple[int, str]] = []

    def __call__(self, command: list[str], env: Mapping[str, str]) -> _Done:
        self.calls.append((int(_option(command, "--nproc-per-node")), env[DEGRADATIONS_ENV]))
        return _Done(self.statuses.pop(0))


def test_supervisor_degrades_one_rank_at_a_time_down_to_min_nproc() -> None:
    fake = _FakeTorchrun([1, 1, 1])
    assert supervise(Launch(4, max_restarts=1, min_nproc=2), ["run"], fake) == 1
    assert fake.calls == [(4, "0"), (3, "1"), (2, "2")]  # stops at --min-nproc

    fake = _FakeTorchrun([1, 0])
    assert supervise(Launch(3, max_restarts=1, min_nproc=2), ["run"], fake) == 0
    assert fake.calls == [(3, "0"), (2, "1")]

    fake = _FakeTorchrun([1])
    assert supervise(Launch(3), ["run"], fake) == 1  # no --min-nproc: never degrades
    assert fake.calls == [(3, "0")]


def test_supervisor_does_not_degrade_a_job_stopped_on_purpose() -> None:
    def stopped(command: list[str], env: Mapping[str, str]) -> _Done:
        os.kill(os.getpid(), signal.SIGTERM)  # lands while the job runs
        return _Done(1)

    before = signal.getsignal(signal.SIGTERM)
    assert supervise(Launch(3, min_nproc=1), ["run"], stopped) == 1
    assert signal.getsignal(signal.SIGTERM) == before


def test_ranks_run_the_entry_module_the_launcher_was_started_as() -> None:
    code = "from pipeline.jobs.launch import entry_module; print(entry_module())"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert plain.stdout.strip() == "pipeline.cli"  # the streamrank script has no module spec
    command = torchrun_command(Launch(2), ["run"], module="tests.support.crash_rank")
    assert command[-3:] == ["-m", "tests.support.crash_rank", "run"]


# The launcher against a real process tree: tests/pipeline/fake_torchrun.py plays torchrun.


class _Tree:
    """Starts the fake torchrun as :func:`start_torchrun` starts torchrun."""

    def __init__(self, out: Path, *options: str) -> None:
        self.out = out
        self.options = options
        self.agent: subprocess.Popen[bytes] | None = None

    def __call__(self, command: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        fake = [sys.executable, "-m", "tests.pipeline.fake_torchrun", "agent", str(self.out)]
        self.agent = start_torchrun([*fake, *self.options], {**env, "PYTHONPATH": str(REPO_ROOT)})
        return self.agent

    def rank_pids(self, generation: int = 0, ranks: int = 2) -> list[int]:
        """Waits until the ranks of ``generation`` are ready (handlers in place)."""
        files = [self.out / f"rank{i}.{generation}.ready" for i in range(ranks)]
        assert _until(lambda: all(f.exists() and f.read_text() for f in files)), "no ranks"
        return [int(f.read_text()) for f in files]


def _until(condition: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    """Polls ``condition`` until it holds (True) or ``timeout_s`` passed (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited, not reaped yet


def _signal_when(ready: Callable[[], object], sig: signal.Signals) -> threading.Thread:
    """Sends ``sig`` to this process (the launcher) once ``ready()`` returns."""

    def send() -> None:
        ready()
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_alone_reaches_every_rank_and_the_job_exits_0(
    tmp_path: Path, sig: signal.Signals
) -> None:
    tree = _Tree(tmp_path, "--ranks", "2", "--mode", "drain")
    sender = _signal_when(tree.rank_pids, sig)
    assert supervise(Launch(2, stop_timeout_s=60), ["run"], tree) == 0
    sender.join(10)
    assert [(tmp_path / f"rank{i}.0.signal").read_text() for i in range(2)] == [sig.name] * 2
    assert not (tmp_path / "agent.signal").exists()  # the ranks got it, not torchrun's agent


def test_ranks_that_do_not_drain_are_killed_with_their_agent(tmp_path: Path) -> None:
    tree = _Tree(tmp_path, "--ranks", "2", "--mode", "ignore")
    pids: list[int] = []
    sender = _signal_when(lambda: pids.extend(tree.rank_pids()), signal.SIGTERM)
    assert supervise(Launch(2, stop_timeout_s=0.5), ["run"], tree) == 128 + signal.SIGKILL
    sender.join(10)
    assert len(pids) == 2
    assert _until(lambda: all(_gone(pid) for pid in pids))  # they died with the agent
    # each was asked to write its stacks to its log first (where it hung)
    assert [(tmp_path / f"rank{i}.0.stacks").read_text() for i in range(2)] == ["asked"] * 2


def test_ranks_restarted_while_stopping_are_stopped_through_the_agent(tmp_path: Path) -> None:
    # The ranks die of the signal (default action) and the agent starts new ones: the
    # launcher then stops the agent, which stops them.
    tree = _Tree(tmp_path, "--ranks", "2", "--mode", "default", "--restart")
    sender = _signal_when(tree.rank_pids, signal.SIGTERM)
    assert supervise(Launch(2, stop_timeout_s=60), ["run"], tree) == 1
    sender.join(10)
    assert (tmp_path / "agent.signal").read_text() == "SIGTERM"


def test_killing_the_launcher_kills_torchrun_and_its_ranks(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from pipeline.jobs.launch import Launch, supervise; "
        "from tests.pipeline.jobs.test_launch import _Tree; "
        "sys.exit(supervise(Launch(2), ['run'], _Tree(Path(sys.argv[1]), '--mode', 'drain')))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    launcher = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env)
    try:
        ranks = _Tree(tmp_path).rank_pids()
        agent = parent_of(ranks[0])
        assert agent is not None and parent_of(agent) == launcher.pid
        launcher.kill()
        launcher.wait(30)
        assert _until(lambda: all(_gone(pid) for pid in [agent, *ranks]))
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(30)
