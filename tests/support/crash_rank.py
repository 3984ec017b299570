"""``python -m tests.support.crash_rank ARGS``: ``streamrank ARGS`` where one rank keeps dying.

A tests-only entry module wrapping the real one (``pipeline.cli``): the serving code has no
crash hook. ``streamrank run --nproc N`` started through this module starts its ranks through
it too (:func:`pipeline.jobs.launch.entry_module`), and ``CRASH_RANK=R/W/S`` makes rank R of a
W-rank job exit with status 1 S seconds after it starts, so "the same rank keeps dying" is
reproducible (``tests/integration/test_degrade.py``).
"""

from __future__ import annotations

import os
import sys
import threading

from model.rank import RankContext
from pipeline.cli import app

CRASH_ENV = "CRASH_RANK"


def arm(rank: RankContext, value: str | None) -> bool:
    """If ``value`` is ``R/W/S`` for this rank, exit(1) in S seconds. Returns whether armed."""
    if not value:
        return False
    r, w, seconds = value.split("/")
    if (int(r), int(w)) != (rank.rank, rank.world_size):
        return False
    print(f"crash_rank: rank {r} of {w} will exit(1) in {seconds} s", file=sys.stderr, flush=True)
    timer = threading.Timer(float(seconds), os._exit, args=(1,))
    timer.daemon = True
    timer.start()
    return True


if __name__ == "__main__":
    arm(RankContext.from_env(), os.environ.get(CRASH_ENV))
    app()
