"""Exactly-once mode on the real stack: a ``read_committed`` reader of the output topic sees
every valid event exactly once, and a ``read_uncommitted`` reader sees the records of the
transactions that were aborted (proof that the faults hit open transactions):

- kill -9 of the pipeline mid-transaction, a restart, then SIGTERM while the broker is down
  (one process): the run exits within the shutdown timeout;
- 2 ranks, each with its own transactional producer: kill -9 of a rank mid-transaction
  (torchrun restarts the ranks; the new producer with the same ``transactional.id`` fences the
  dead one's transaction), then SIGTERM to the launcher alone, then a restart;
- one process across a broker SIGKILL and restart 10 s later: the transaction open at the
  kill is aborted, the run goes back to its last committed offsets and finishes by itself;
- 2 ranks across a broker SIGKILL and restart, a transaction open at the kill and aborted
  after it (the ranks recover, or exit and are restarted by torchrun);
- zombie fencing: a second producer with the same ``transactional.id`` fences the first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from model.rank import RankContext
from pipeline.connectors.kafka.clients import make_consumer, make_producer
from pipeline.connectors.kafka.consumer import InputConsumer
from pipeline.connectors.kafka.producer import OutputProducer
from pipeline.settings.delivery import DeliverySettings, Guarantee
from pipeline.settings.loading import Settings
from pipeline.stages.commit import TransactionalCheckpointer, transactional_kafka
from pipeline.types import DeliveryFailed
from tests.conftest import LocalStack
from tests.faults.helpers import (
    Cli,
    audit_exactly_once,
    broker_down,
    members_with_partitions,
    open_transaction_records,
    run_until_idle,
    signal_run,
    start_run,
    wait_until,
)
from tests.integration.conftest import SentEvents, produced_count, wait_for_outputs
from tests.processes import descendants, environ, gone
from tests.support.logs import failure_excerpt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EXACTLY_ONCE = {
    "STREAMRANK_DELIVERY__GUARANTEE": "exactly_once",
    "STREAMRANK_DELIVERY__COMMIT_INTERVAL_MS": "100",
    "STREAMRANK_BATCHING__MAX_BATCH_ROWS": "64",
}
LONG_TRANSACTIONS = {
    **EXACTLY_ONCE,
    "STREAMRANK_DELIVERY__COMMIT_INTERVAL_MS": "2000",
    "STREAMRANK_BATCHING__MAX_IN_FLIGHT_BATCHES": "64",  # no early commit after 4 batches
}
"""A transaction spans ~2 s of batches: a kill almost always lands inside one that holds
records."""


def _rank_pids(launcher_pid: int) -> list[int]:
    return [pid for pid in descendants(launcher_pid) if "RANK" in environ(pid)]


def test_kill_9_then_sigterm_while_the_broker_is_down_each_event_once(
    local_stack: LocalStack,
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Cli,
) -> None:
    sent = send_events(pipeline_settings, 4000)
    # 1. kill -9 mid-transaction: the transaction is left open, its records in the log. (A
    # kill that lands between two transactions is tried again: a restart first fences the
    # open transactions of the runs before it.)
    for attempt in range(3):
        log = tmp_path / f"killed-{attempt}.log"
        proc = start_run(cli, pipeline_settings, log, LONG_TRANSACTIONS)
        wait_until(lambda: open_transaction_records(pipeline_settings) > 0, "an open transaction")
        signal_run(proc, pipeline_settings, log, signal.SIGKILL, total=4000)
        if open_transaction_records(pipeline_settings) > 0:  # left open by the killed run
            break
    else:
        pytest.fail("three kills in a row landed between transactions")

    # 2. A restart (it fences that transaction), then the broker dies under it and SIGTERM
    # comes while the broker is down: the run must not hang on the broker.
    log = tmp_path / "second.log"
    env = {**EXACTLY_ONCE, "STREAMRANK_SHUTDOWN__TIMEOUT_S": "8"}
    proc = start_run(cli, pipeline_settings, log, env, outputs=produced_count(pipeline_settings))
    wait_for_outputs(pipeline_settings, produced_count(pipeline_settings) + 200, proc=proc, log=log)
    with broker_down(local_stack, "kill"):
        time.sleep(3)  # the run is now waiting on the broker (a commit, a full queue)
        assert proc.poll() is None, failure_excerpt(log)
        sent_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            # shutdown.timeout_s (8 s) bounds every wait, then the process exits.
            code = proc.wait(10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 10 s after SIGTERM\n{failure_excerpt(log)}")
        exit_s = time.monotonic() - sent_at
    # What it had not committed could not be: it stops non-zero (a supervisor restarts it).
    assert code == 1, failure_excerpt(log)
    print(f"\nRELIABILITY sigterm-broker-down exit_status={code} exit_s={exit_s:.1f}")

    # 3. A last run scores the rest.
    run_s = run_until_idle(cli, pipeline_settings, tmp_path / "third.log", EXACTLY_ONCE)
    missing, duplicates, aborted = audit_exactly_once(
        "kill-9-then-sigterm-broker-down", pipeline_settings, sent.ids, run_s
    )
    assert missing == 0
    assert duplicates == 0
    assert aborted > 0  # the restart fenced the killed run's transaction: it was aborted


def _across_a_broker_outage(
    stack: LocalStack, settings: Settings, sent: SentEvents, run: subprocess.Popen, log: Path
) -> tuple[int, int, int, float]:
    """Kill the broker with SIGKILL while a transaction holds records, start it again 10 s
    later (same data dir), and wait for ``run`` to finish by itself with exit 0.

    The outage outlasts the consumers' sessions (``kafka.session_timeout_ms``, 10 s): the
    transaction open at the kill can only be aborted after it, its records left in the log.

    Returns:
        (missing, duplicates, aborted) of :func:`audit_exactly_once`, and the seconds from the
        broker's return to the run's exit.
    """
    wait_until(lambda: open_transaction_records(settings) > 0, "an open transaction")
    assert produced_count(settings) < len(sent.ids), "the broker kill came too late"
    with broker_down(stack, "kill"):  # a crashed broker, mid-transaction
        time.sleep(10)  # the outage
    back = time.monotonic()
    assert run.wait(480) == 0, failure_excerpt(log, 4000)
    recover_s = time.monotonic() - back
    return (*audit_exactly_once(log.stem, settings, sent.ids, recover_s), recover_s)


def test_one_process_rides_out_a_broker_kill_9_and_restart_each_event_once(
    local_stack: LocalStack,
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Cli,
) -> None:
    # As Kafka Streams does: the open transaction is retried or aborted, the run goes back to
    # its last committed offsets and goes on; nobody restarts it.
    sent = send_events(pipeline_settings, 6000)
    log = tmp_path / "broker-kill-9-one-process.log"
    proc = start_run(cli, pipeline_settings, log, EXACTLY_ONCE, "--exit-when-idle", "20")
    missing, duplicates, aborted, _ = _across_a_broker_outage(
        local_stack, pipeline_settings, sent, proc, log
    )
    assert missing == 0, failure_excerpt(log, 4000)
    assert duplicates == 0
    assert aborted > 0  # the transaction open at the kill was aborted after it
    assert "transaction aborted" in log.read_text()  # by this run, which went on


def test_two_ranks_kill_9_of_a_rank_then_sigterm_to_the_launcher_each_event_once(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Cli,
) -> None:
    sent = send_events(pipeline_settings, 3000)
    env = {**LONG_TRANSACTIONS, "STREAMRANK_SHUTDOWN__TIMEOUT_S": "8"}
    log = tmp_path / "first.log"
    launcher = start_run(cli, pipeline_settings, log, env, "--nproc", "2", "--max-restarts", "2")
    ranks = _rank_pids(launcher.pid)
    assert len(ranks) == 2, ranks
    # kill -9 one rank while both score, inside transactions that hold records: the killed
    # rank's transaction is left open, and so is its partner's (it fails in the next
    # collective); the restarted ranks fence both.
    wait_until(lambda: members_with_partitions(pipeline_settings) == 2, "both ranks scoring")
    wait_until(lambda: open_transaction_records(pipeline_settings) > 0, "an open transaction")
    assert produced_count(pipeline_settings) < 3000, "the kill came too late"
    assert launcher.poll() is None and not gone(ranks[1], timeout_s=0)
    os.kill(ranks[1], signal.SIGKILL)
    assert gone(ranks[1])
    # torchrun restarts both ranks; the new rank 1 fences the dead one's transaction, and the
    # job goes on scoring.
    wait_until(lambda: len(set(_rank_pids(launcher.pid)) - set(ranks)) == 2, "restarted ranks")
    restarted_at = produced_count(pipeline_settings)
    wait_for_outputs(pipeline_settings, restarted_at + 200, proc=launcher, log=log)
    # SIGTERM to the launcher alone: every rank commits its open transaction and exits.
    exit_s = signal_run(launcher, pipeline_settings, log, signal.SIGTERM, total=10**9)
    assert exit_s < 10.0, f"the ranks took {exit_s:.1f}s to drain"  # shutdown.timeout_s 8 s
    assert "exitcode: -9" in log.read_text()  # torchrun saw the kill
    print(f"\nRELIABILITY sigterm-launcher-2-ranks-exactly-once exit_s={exit_s:.1f}")

    second = tmp_path / "second.log"
    run_s = run_until_idle(cli, pipeline_settings, second, EXACTLY_ONCE, "--nproc", "2")
    missing, duplicates, aborted = audit_exactly_once(
        "kill-9-rank-then-sigterm-2-ranks", pipeline_settings, sent.ids, run_s
    )
    assert missing == 0
    assert duplicates == 0
    assert aborted > 0  # the killed rank's open transaction was aborted


def test_two_ranks_across_a_broker_kill_9_and_restart_each_event_once(
    local_stack: LocalStack,
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    tmp_path: Path,
    cli: Cli,
) -> None:
    sent = send_events(pipeline_settings, 3000)
    log = tmp_path / "broker-kill-9-2-ranks.log"
    args = ("--nproc", "2", "--max-restarts", "6", "--exit-when-idle", "8")
    launcher = start_run(cli, pipeline_settings, log, LONG_TRANSACTIONS, *args)
    # The ranks go back to their last committed offsets and go on, or give up, exit non-zero
    # and are restarted by torchrun (then fence their predecessors' transactions); either way
    # the job finishes.
    missing, duplicates, aborted, _ = _across_a_broker_outage(
        local_stack, pipeline_settings, sent, launcher, log
    )
    assert missing == 0
    assert duplicates == 0
    assert aborted > 0  # the transaction open at the kill was aborted after it


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(
    pipeline_settings: Settings,
) -> None:
    settings = pipeline_settings.model_copy(
        update={"delivery": DeliverySettings(guarantee=Guarantee.EXACTLY_ONCE)}
    )
    kafka = transactional_kafka(settings, RankContext())
    output = settings.topics.output
    consumer = InputConsumer(make_consumer(kafka.config))
    zombie = OutputProducer(make_producer(kafka.config))
    first = TransactionalCheckpointer(consumer, zombie, commit_interval_s=60.0)
    checkpoint = first.open
    checkpoint.expect(10)
    zombie.send(output, [f"zombie-{i}".encode() for i in range(10)], [None] * 10, checkpoint)
    assert zombie.flush(30) == 0  # in the log, inside the open transaction

    # same transactional.id: a restart of the same member
    successor = OutputProducer(make_producer(kafka.config))
    second = TransactionalCheckpointer(consumer, successor, commit_interval_s=60.0)
    with pytest.raises(DeliveryFailed, match="producer unusable"):
        first.flush_and_commit(10)  # the zombie cannot commit: fenced (a fatal error)
    assert first.aborts == 0 and first.transactions == 0
    checkpoint = second.open
    checkpoint.expect(5)
    successor.send(output, [f"live-{i}".encode() for i in range(5)], [None] * 5, checkpoint)
    second.flush_and_commit(30)
    assert second.transactions == 1
    consumer.close()

    def read(isolation_level: str, expected: int) -> list[bytes]:
        """The output topic's values: waits for ``expected``, then 2 s for extras."""
        reader = Consumer(
            {
                **settings.kafka.config.consumer,
                "group.id": f"fence-reader-{isolation_level}",
                "auto.offset.reset": "earliest",
                "isolation.level": isolation_level,
            }
        )
        reader.subscribe([output])
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            values += [m.value() for m in reader.consume(100, 0.5) if m.error() is None]
            if len(values) >= expected:
                deadline = min(deadline, time.monotonic() + 2)
        reader.close()
        return values

    committed = read("read_committed", 5)
    assert sorted(committed) == sorted(f"live-{i}".encode() for i in range(5))
    uncommitted = read("read_uncommitted", 15)
    assert sorted(v for v in uncommitted if v.startswith(b"zombie")) == sorted(
        f"zombie-{i}".encode() for i in range(10)
    )  # the fenced transaction's records are in the log, aborted
