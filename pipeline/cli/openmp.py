"""How the forward's OpenMP threads wait between parallel regions: short spins, then sleep.

On a CPU, torch runs each operator of the forward as an OpenMP parallel region across its
intra-op threads (libgomp in the PyPI builds). Between two regions a thread that has finished
its part spins, by default for libgomp's ``GOMP_SPINCOUNT`` of 300,000 iterations, before it
sleeps. On a host shared with other processes that is the forward's undoing: while the loop
does its host work between two forwards, the idle OpenMP worker spins on a core the broker,
Redis or the producer need, and when another process holds one of the cores, every region of
the forward waits for the thread that lost its core while its partner spins (BENCHMARKS.md,
section 12: on a loaded machine a 280-row forward took 76 ms and 1.1 s with libgomp's default,
11 and 30 ms with 1,000 spins).

``streamrank`` therefore sets ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` for its process and the
processes it starts (ranks, the soak's pipeline), unless the environment already says how
OpenMP threads should wait (``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY``): a user's setting wins.
libgomp reads it once, when torch is first imported, so :func:`openmp_defaults` runs when the
command line is imported, before any command loads torch.

Example::

    openmp_defaults()                 # at the top of the CLI, before torch is imported
    os.environ["GOMP_SPINCOUNT"]      # "1000" unless the user chose otherwise
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["SPIN_COUNT", "openmp_defaults"]

SPIN_COUNT = "1000"
"""Spins before an idle OpenMP thread sleeps (libgomp's default: 300,000)."""

USER_SETTINGS = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
"""Variables that, when set, mean the user has chosen how OpenMP threads wait."""


def openmp_defaults(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` unless ``environ`` chooses how OpenMP
    threads wait already.

    Args:
        environ: the environment to complete (the process's by default).
    """
    if not any(name in environ for name in USER_SETTINGS):
        environ["GOMP_SPINCOUNT"] = SPIN_COUNT
