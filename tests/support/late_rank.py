"""``python -m tests.support.late_rank ARGS``: ``streamrank ARGS`` where one rank joins the
consumer group late, and one rank's last commit is slow.

A tests-only entry module wrapping the real one (``pipeline.cli``), as
:mod:`tests.support.crash_rank` does: ``streamrank run --nproc N`` started through it starts its
ranks through it too. ``LATE_RANK=R/S`` makes rank R step with the others from the start, with
nothing to score, and subscribe to the input topic only S seconds after its loop started; then
it prints :data:`JOINING` (to stderr, in the launcher's log). From then on the group moves
partitions to it while the other ranks score: a test that sends its signal then lands it
mid-rebalance. ``SLOW_COMMIT=R/S`` makes rank R's drain wait S seconds before its commit, as a
slow flush would (on a loaded host): a rank that left the group at once would start a
rebalance under that commit.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from model.rank import RankContext
from pipeline.cli import app
from pipeline.runtime.drain import Drain
from pipeline.stages.source import KafkaSource

LATE_ENV = "LATE_RANK"
SLOW_ENV = "SLOW_COMMIT"
JOINING = "late_rank: joining the group now"


def arm(rank: RankContext, value: str | None) -> bool:
    """If ``value`` is ``R/S`` for this rank, defer its subscription. Returns whether armed."""
    if not value:
        return False
    late_rank, seconds = value.split("/")
    if int(late_rank) != rank.rank:
        return False
    subscribe, poll = KafkaSource.subscribe, KafkaSource.poll
    deferred: list[Any] = []

    def defer(self: KafkaSource, *callbacks: Any) -> None:
        deferred.append((time.monotonic() + float(seconds), callbacks))

    def late_poll(self: KafkaSource, timeout_s: float) -> int:
        if deferred:
            join_at, callbacks = deferred[0]
            if time.monotonic() < join_at:
                time.sleep(timeout_s)  # an empty poll, as the client's would be
                return 0
            deferred.clear()
            print(JOINING, file=sys.stderr, flush=True)
            subscribe(self, *callbacks)
        return poll(self, timeout_s)

    KafkaSource.subscribe = defer  # type: ignore[method-assign]
    KafkaSource.poll = late_poll  # type: ignore[method-assign]
    return True


def slow(rank: RankContext, value: str | None) -> bool:
    """If ``value`` is ``R/S`` for this rank, its drain waits S seconds before committing."""
    if not value:
        return False
    slow_rank, seconds = value.split("/")
    if int(slow_rank) != rank.rank:
        return False
    commit = Drain.commit

    def slow_commit(self: Drain) -> None:
        time.sleep(float(seconds))
        commit(self)

    Drain.commit = slow_commit  # type: ignore[method-assign]
    return True


if __name__ == "__main__":
    rank = RankContext.from_env()
    arm(rank, os.environ.get(LATE_ENV))
    slow(rank, os.environ.get(SLOW_ENV))
    app()
