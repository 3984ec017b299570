"""Tests for pipeline.launch: torchrun command lines, the degrading supervisor, the test hook."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping

import pytest

from pipeline.launch import (
    DEGRADATIONS_ENV,
    Launch,
    supervise,
    torchrun_command,
)


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


class _FakeTorchrun:
    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.calls: list[tuple[int, str]] = []

    def __call__(self, command: list[str], env: Mapping[str, str]) -> int:
        self.calls.append((int(_option(command, "--nproc-per-node")), env[DEGRADATIONS_ENV]))
        return self.statuses.pop(0)


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
    def stopped(command: list[str], env: Mapping[str, str]) -> int:
        os.kill(os.getpid(), signal.SIGTERM)  # the signal reaches the launcher too
        return 1

    before = signal.getsignal(signal.SIGTERM)
    assert supervise(Launch(3, min_nproc=1), ["run"], stopped) == 1
    assert signal.getsignal(signal.SIGTERM) == before


def test_ranks_run_the_entry_module_the_launcher_was_started_as() -> None:
    code = "from pipeline.launch import entry_module; print(entry_module())"
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert plain.stdout.strip() == "pipeline.cli"  # the streamrank script has no module spec
    command = torchrun_command(Launch(2), ["run"], module="tests.support.crash_rank")
    assert command[-3:] == ["-m", "tests.support.crash_rank", "run"]
