"""A stand-in for torchrun in the launcher's tests: an "agent" process starting "ranks".

``python -m tests.pipeline.fake_torchrun agent OUT --ranks N --mode M [--restart]`` starts N rank
processes (``LOCAL_RANK`` in their environment, as torchrun's workers), waits for them and exits
0 when all exited 0, else 1. Like torchrun's agent, a SIGTERM/SIGINT to the agent itself
stops the ranks (SIGTERM) and exits 1; it is recorded in ``OUT/agent.signal``. With
``--restart`` a failed generation of ranks is started again once.

Each rank dies with the agent (``PR_SET_PDEATHSIG``), writes ``OUT/rank<i>.<generation>.ready``
(its pid) once its handlers are in place, and by ``--mode``:

- ``drain``: on SIGTERM/SIGINT writes the signal's name to ``OUT/rank<i>.<generation>.signal``
  and exits 0;
- ``ignore``: ignores SIGTERM/SIGINT (a rank that never drains); asked for its stacks
  (:data:`~pipeline.jobs.launch.STACKS_SIGNAL`), writes ``OUT/rank<i>.<generation>.stacks``;
- ``default``: keeps the default action (dies of the signal).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from pipeline.jobs.launch import STACKS_SIGNAL
from pipeline.jobs.lifetime import die_with_parent


def _rank(out: Path, index: int, generation: int, mode: str) -> None:
    die_with_parent(os.getppid())
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        (out / f"rank{index}.{generation}.signal").write_text(signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        if mode == "drain":
            signal.signal(sig, on_signal)
        elif mode == "ignore":
            signal.signal(sig, signal.SIG_IGN)
    if mode == "ignore":
        stacks = out / f"rank{index}.{generation}.stacks"
        signal.signal(STACKS_SIGNAL, lambda _signum, _frame: stacks.write_text("asked"))
    (out / f"rank{index}.{generation}.ready").write_text(str(os.getpid()))
    while not stop.wait(0.05):
        pass


def _start_ranks(out: Path, ranks: int, generation: int, mode: str) -> list[subprocess.Popen]:
    command = [sys.executable, "-m", "tests.pipeline.fake_torchrun", "rank", str(out)]
    command += ["--mode", mode]
    return [
        subprocess.Popen(
            [*command, "--index", str(i), "--generation", str(generation)],
            env={**os.environ, "LOCAL_RANK": str(i)},
        )
        for i in range(ranks)
    ]


def _agent(out: Path, ranks: int, mode: str, restart: bool) -> int:
    procs: list[subprocess.Popen] = []
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        (out / "agent.signal").write_text(signal.Signals(signum).name)
        stopping.append(signum)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    for generation in range(2 if restart else 1):
        procs[:] = _start_ranks(out, ranks, generation, mode)
        while any(proc.poll() is None for proc in procs):
            time.sleep(0.05)
        if stopping:
            return 1
        if all(proc.returncode == 0 for proc in procs):
            return 0
    return 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["agent", "rank"])
    parser.add_argument("out", type=Path)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mode", choices=["drain", "ignore", "default"], default="drain")
    parser.add_argument("--restart", action="store_true")
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--generation", type=int, default=0)
    args = parser.parse_args()
    if args.role == "rank":
        _rank(args.out, args.index, args.generation, args.mode)
        return 0
    return _agent(args.out, args.ranks, args.mode, args.restart)


if __name__ == "__main__":
    sys.exit(main())
