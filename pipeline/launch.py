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
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import FrameType

log = logging.getLogger(__name__)

__all__ = ["DEGRADATIONS_ENV", "Launch", "entry_module", "supervise", "torchrun_command"]

#: Set by :func:`supervise` for the ranks: how many times the job came back with fewer ranks.
DEGRADATIONS_ENV = "STREAMRANK_DEGRADATIONS"


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


def supervise(
    launch: Launch,
    cli_args: list[str],
    call: Callable[[list[str], Mapping[str, str]], int] | None = None,
) -> int:
    """Run torchrun; while it fails and ``launch.min_nproc`` allows, run it with one rank fewer.

    SIGTERM / SIGINT to this process stop the loop (the job itself stops through its process
    group, which the signal reaches too): a job stopped on purpose is not degraded.

    Args:
        launch: the launch options.
        cli_args: the ``streamrank`` arguments of the ranks.
        call: runs a command with an environment and returns its exit status (tests pass a
            fake); default ``subprocess.call``.

    Returns:
        The exit status of the last torchrun.

    Example::

        sys.exit(supervise(Launch(3, max_restarts=1, min_nproc=2), ["run"]))
    """
    run = call or (lambda cmd, env: subprocess.call(cmd, env=dict(env)))
    stopping: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        nproc, degradations = launch.nproc, 0
        while True:
            command = torchrun_command(launch, cli_args, nproc, entry_module())
            log.info("starting %d ranks: %s", nproc * launch.nnodes, " ".join(command))
            rc = run(command, {**os.environ, DEGRADATIONS_ENV: str(degradations)})
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
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
