"""A clean stop during a rebalance repeats nothing (at-least-once, the real broker).

SIGTERM reaches a 2-rank launcher while the group is moving partitions to its second rank (it
joins late: :mod:`tests.support.late_rank`), and the first rank's last commit is slow (a slow
flush): the second rank, which holds nothing yet, is done at once, and if it left the group
then, the rebalance that starts would refuse the first rank's commit (``ILLEGAL_GENERATION``,
``REBALANCE_IN_PROGRESS``). Each rank's drain keeps polling with its partitions paused until
the group settles, commits again, and leaves the group only once both ranks have committed; a
restart then scores the rest: every event once, no event twice, in each of several rounds.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from model.synthetic import SyntheticWorld
from pipeline.settings.loading import Settings
from tests.faults.helpers import (
    Cli,
    report,
    run_until_idle,
    seeded_settings,
    signal_run,
    wait_until,
)
from tests.integration.conftest import SentEvents, collect
from tests.support.late_rank import JOINING, LATE_ENV, SLOW_ENV

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROUNDS = 5
EVENTS = 4000
FIRST_RUN = {
    "STREAMRANK_BATCHING__MAX_BATCH_ROWS": "64",  # many commits, slow enough to stop mid-stream
    "STREAMRANK_SHUTDOWN__TIMEOUT_S": "8",
    LATE_ENV: "1/3",  # rank 1 joins the group 3 s after the ranks started stepping
    SLOW_ENV: "0/1.5",  # rank 0's last commit comes 1.5 s after the stop (a slow flush)
}


def _moving(log: Path) -> bool:
    """Rank 0 has revoked partitions after rank 1 started joining."""
    text = log.read_text()
    return JOINING in text and "rank0 pipeline.runtime.rebalance: revoked" in text.split(JOINING)[1]


def test_sigterm_while_partitions_move_to_the_second_rank_then_a_restart_repeats_nothing(
    settings_factory: Callable[..., Settings],
    trained_checkpoint: Path,
    world: SyntheticWorld,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Cli,
) -> None:
    outcomes = []
    for round_ in range(ROUNDS):
        settings = seeded_settings(settings_factory, trained_checkpoint, world)
        sent = send_events(settings, EVENTS)
        log = tmp_path / f"first-{round_}.log"
        launcher = cli(
            settings,
            "run",
            "--nproc",
            "2",
            module="tests.support.late_rank",
            extra_env=FIRST_RUN,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        # Rank 1 joins; the group starts moving partitions to it: the first rank revokes them
        # (the cooperative protocol's first round), the second one is not assigned them yet.
        moving = lambda: _moving(log) or launcher.poll() is not None  # noqa: B023, E731
        wait_until(moving, "partitions moving to rank 1", 180)
        exit_s = signal_run(launcher, settings, log, signal.SIGTERM, total=EVENTS)
        # The drain ends by shutdown.timeout_s (8 s, the injected 1.5 s included); closing the
        # consumer then waits at most 5 s more for its LeaveGroup, which the coordinator answers
        # only after a JoinGroup of the same member still in flight (librdkafka's timeout).
        assert exit_s < 8 + 5 + 1, f"the ranks took {exit_s:.1f}s to drain and leave"

        run_until_idle(cli, settings, tmp_path / f"second-{round_}.log", {}, "--nproc", "2")
        recs = collect(settings, expected=EVENTS)
        scenario = f"sigterm-mid-rebalance-2-ranks-{round_}"
        outcomes.append(report(scenario, sent.ids, recs, exit_s, "at_least_once"))
    assert outcomes == [(0, 0)] * ROUNDS  # (missing, duplicates) of each round
