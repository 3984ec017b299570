"""Launching ranks with torchrun, and coming back with fewer ranks when one keeps failing.

``streamrank run --nproc N`` re-executes ``streamrank run`` under ``torch.distributed.run``
(:func:`torchrun_command`): N ranks on this host, or, with ``--nnodes``, N ranks on each of
several hosts that meet at ``--rdzv-endpoint`` (torchrun's static rendezvous: node 0 hosts the
store there). torchrun restarts all ranks when one dies, up to ``--max-restarts`` times, then
exits non-zero. :func:`supervise` is the loop around it: on one host, a failed torchrun is run
again with one rank fewer, down to ``--min-nproc``; the new ranks re-plan the tables for their
world size and load the checkpoint resharded, and resume from the committed offsets (at-least-
once: nothing lost). Each degradation is logged and counted (``STREAMRANK_DEGRADATIONS`` ->
the ranks' ``streamrank_degradations`` gauge).

Stopping and dying together (:mod:`pipeline.jobs.lifetime`): torchrun runs in a process group of its
own and dies with the launcher (``PR_SET_PDEATHSIG``), and each rank dies with torchrun, so a
SIGKILLed launcher leaves nothing behind. SIGTERM/SIGINT to the launcher alone (``docker stop``,
Kubernetes, Ctrl-C) is passed on to every rank, which finishes its open batch, commits and
leaves the group; torchrun then sees every rank succeed and exits 0. Ranks still running
``Launch.stop_timeout_s`` after the signal are killed, after each has written its threads' stacks
to its log (:data:`STACKS_SIGNAL`): where a rank hung is in the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Protocol

from pipeline.jobs.lifetime import LAUNCHER_PID_ENV, children, preexec_die_with_parent

log = logging.getLogger(__name__)

__all__ = [
    "DEGRADATIONS_ENV",
    "STACKS_SIGNAL",
    "Job",
    "Launch",
    "entry_module",
    "start_torchrun",
    "stop_job",
    "supervise",
    "torchrun_command",
]

#: Set by :func:`supervise` for the ranks: how many times the job came back with fewer ranks.
DEGRADATIONS_ENV = "STREAMRANK_DEGRADATIONS"

#: Sent to ranks still running when the stop's time is over, before they are killed: each
#: writes its threads' stacks to stderr (``faulthandler``, registered by the rank at start).
STACKS_SIGNAL = signal.SIGUSR1
STACKS_WAIT_S = 0.5
"""How long the ranks get to write their stacks before they are killed."""


@dataclass(frozen=True)
class Launch:
    """How ``streamrank run`` starts its ranks.

    Args:
        nproc: ranks per node.
        max_restarts: times torchrun restarts the ranks before giving up.
        min_nproc: fewest ranks (per node) :func:`supervise` degrades to; ``nproc``: never.
        nnodes: hosts in the job (torchrun ``--nnodes``).
        node_rank: this host's index (torchrun ``--node-rank``).
        rdzv_endpoint: ``HOST:PORT`` where the nodes meet (node 0 hosts the store); needed
            with ``nnodes > 1``.
        stop_timeout_s: after SIGTERM/SIGINT, how long the ranks get to finish their open
            batch, commit and exit before they are killed.

    Example::

        Launch(nproc=3, max_restarts=1, min_nproc=2)
        Launch(nproc=2, max_restarts=0, nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.5:29400")
    """

    nproc: int
    max_restarts: int = 3
    min_nproc: int | None = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    stop_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.nproc < 1 or self.nnodes < 1:
            raise ValueError(f"--nproc and --nnodes must be >= 1, got {self.nproc}, {self.nnodes}")
        if not 1 <= self.floor <= self.nproc:
            raise ValueError(f"--min-nproc must be in 1..{self.nproc}, got {self.min_nproc}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT")
        if self.rdzv_endpoint is not None:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(
                    "--rdzv-endpoint must be HOST:PORT with a port in 1..65535 "
                    f"(e.g. 10.0.0.5:29400), got {self.rdzv_endpoint!r}"
                )
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in 0..{self.nnodes - 1}, got {self.node_rank}")
        if self.nnodes > 1 and self.floor < self.nproc:
            raise ValueError("--min-nproc (degrading) works on one node only")

    @property
    def floor(self) -> int:
        """The fewest ranks per node to degrade to."""
        return self.nproc if self.min_nproc is None else self.min_nproc

    @property
    def distributed(self) -> bool:
        """Whether this launch runs under torchrun (several ranks or several nodes)."""
        return self.nproc * self.nnodes > 1


def entry_module() -> str:
    """The module the ranks run: the one this process was started as (``python -m X``), so
    that a wrapping entry point runs the ranks too; ``pipeline.cli`` for the ``streamrank``
    script.

    Example::

        entry_module()  # "pipeline.cli"
    """
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = spec.name if spec is not None else "pipeline.cli"
    return name.removesuffix(".__main__")


def torchrun_command(
    launch: Launch, cli_args: list[str], nproc: int | None = None, module: str = "pipeline.cli"
) -> list[str]:
    """The ``torchrun`` command line that runs ``streamrank <cli_args>`` as ``launch`` says.

    Args:
        launch: the launch options.
        cli_args: the ``streamrank`` arguments the ranks run (``["run", ...]``).
        nproc: ranks per node for this attempt (default ``launch.nproc``).
        module: the entry module of the ranks (:func:`entry_module`).

    Returns:
        ``[python, -m, torch.distributed.run, ..., -m, <module>, *cli_args]``.

    Example::

        torchrun_command(Launch(2), ["run", "--exit-when-idle", "3"])
    """
    where = (
        ["--standalone"]
        if launch.nnodes == 1
        else [
            f"--nnodes={launch.nnodes}",
            f"--node-rank={launch.node_rank}",
            "--rdzv-backend=static",
            f"--rdzv-endpoint={launch.rdzv_endpoint}",
        ]
    )
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        f"--nproc-per-node={nproc or launch.nproc}",
        f"--max-restarts={launch.max_restarts}",
        "-m",
        module,
        *cli_args,
    ]


class Job(Protocol):
    """A started torchrun, as :func:`supervise` drives it (``subprocess.Popen`` fits)."""

    @property
    def pid(self) -> int: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


def start_torchrun(command: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """Start torchrun in a process group of its own, bound to die with this process.

    Its own group: a signal to the launcher's group (a terminal's Ctrl-C) reaches the launcher
    only, which passes it on to the ranks (:func:`supervise`), so each rank gets it once.

    Args:
        command: the :func:`torchrun_command`.
        env: its environment (the launcher's pid is added as
            :data:`~pipeline.jobs.lifetime.LAUNCHER_PID_ENV`).

    Returns:
        The running torchrun.
    """
    return subprocess.Popen(
        command,
        env={**env, LAUNCHER_PID_ENV: str(os.getpid())},
        preexec_fn=preexec_die_with_parent(signal.SIGKILL),
        process_group=0,
    )


def supervise(
    launch: Launch,
    cli_args: list[str],
    start: Callable[[list[str], Mapping[str, str]], Job] = start_torchrun,
    poll_s: float = 0.2,
) -> int:
    """Run torchrun; while it fails and ``launch.min_nproc`` allows, run it with one rank fewer.

    SIGTERM / SIGINT to this process are passed on to every rank (:func:`stop_job`) and stop
    the loop: a job stopped on purpose is not degraded.

    Args:
        launch: the launch options.
        cli_args: the ``streamrank`` arguments of the ranks.
        start: starts a command with an environment (tests pass a fake torchrun); default
            :func:`start_torchrun`.
        poll_s: how often the job is checked while it runs.

    Returns:
        The exit status of the last torchrun (``128 + N`` when it died of signal N).

    Example::

        sys.exit(supervise(Launch(3, max_restarts=1, min_nproc=2), ["run"]))
    """
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        nproc, degradations = launch.nproc, 0
        while not stopping:
            command = torchrun_command(launch, cli_args, nproc, entry_module())
            log.info("starting %d ranks: %s", nproc * launch.nnodes, " ".join(command))
            job = start(command, {**os.environ, DEGRADATIONS_ENV: str(degradations)})
            rc = stop_job(job, stopping, launch.stop_timeout_s, poll_s)
            if rc == 0 or stopping or nproc <= launch.floor:
                return rc
            degradations += 1
            log.warning(
                "the %d-rank job failed (exit status %d) after %d restart(s); degrading to %d "
                "ranks (degradation %d, --min-nproc %d)",
                nproc,
                rc,
                launch.max_restarts,
                nproc - 1,
                degradations,
                launch.floor,
            )
            nproc -= 1
        return 128 + stopping[0]  # stopped before (another) job started
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_job(job: Job, stopping: list[int], timeout_s: float, poll_s: float = 0.2) -> int:
    """Wait for ``job``; once a signal lands in ``stopping``, pass it on to the ranks.

    The signal goes to torchrun's workers themselves: each rank finishes its open batch,
    commits and exits 0, and torchrun, seeing every rank succeed, exits 0 (signalled itself,
    its agent would stop the ranks the same way but exit 1). When there is no rank to signal
    (still starting), or torchrun starts new ranks after the signal (a rank died and was
    restarted), torchrun's agent gets SIGTERM and stops its workers. Past ``timeout_s`` after
    the first signal, torchrun is killed; its ranks die with it (:mod:`pipeline.jobs.lifetime`).

    Args:
        job: the running torchrun.
        stopping: signals received so far (appended to by a signal handler).
        timeout_s: how long the ranks get to drain after the first signal.
        poll_s: how often to look.

    Returns:
        torchrun's exit status (``128 + N`` when it died of signal N).

    Example::

        rc = stop_job(subprocess.Popen(torchrun_command(Launch(2), ["run"])), [], 30.0)
    """
    passed_on = 0
    signalled: set[int] = set()
    agent_stopped = False
    kill_at: float | None = None
    while True:
        try:
            return _exit_status(job.wait(poll_s))
        except subprocess.TimeoutExpired:
            pass
        if len(stopping) > passed_on:
            sig, passed_on = stopping[-1], len(stopping)
            kill_at = kill_at or time.monotonic() + timeout_s
            ranks = _workers(job.pid)
            log.info("signal %d: passing it on to ranks %s", sig, ranks or "(none yet)")
            if ranks:
                _signal_all(ranks, sig)
                signalled.update(ranks)
            else:
                job.send_signal(signal.SIGTERM)
                agent_stopped = True
        elif kill_at is not None:
            if time.monotonic() >= kill_at:
                left = _workers(job.pid)
                log.error(
                    "ranks still running %.0fs after the signal: killing them (their stacks "
                    "follow in their logs)",
                    timeout_s,
                )
                _signal_all(left, STACKS_SIGNAL)
                time.sleep(STACKS_WAIT_S)
                job.kill()
                return _exit_status(job.wait())
            if not agent_stopped and set(_workers(job.pid)) - signalled:
                log.warning("torchrun restarted its ranks while stopping: stopping torchrun")
                job.send_signal(signal.SIGTERM)
                agent_stopped = True


def _workers(agent: int) -> list[int]:
    """torchrun's worker processes (its children with ``LOCAL_RANK`` in their environment)."""
    out = []
    for pid in children(agent):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(var.startswith(b"LOCAL_RANK=") for var in environ):
            out.append(pid)
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile
            os.kill(pid, sig)


def _exit_status(rc: int) -> int:
    """``Popen`` reports death by signal N as -N; a shell as 128 + N."""
    return 128 - rc if rc < 0 else rc
