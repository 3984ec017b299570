"""Helpers of the fault suite: start/stop the pipeline CLI around a fault, read the DLQ, and
print what a test measured (``pytest -s``) for RELIABILITY.md."""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from model.synthetic import SyntheticWorld
from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec
from pipeline.connectors.kafka.clients import make_consumer
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.loading import Settings
from pipeline.tools.recommendation_reader import read_messages
from tests.conftest import REPO_ROOT, LocalStack
from tests.integration.conftest import (
    WORLD,
    collect,
    model_settings,
    produced_count,
    seed_features,
    wait_for_outputs,
)
from tests.support.logs import failure_excerpt

Cli = Callable[..., subprocess.Popen]

FAST_COMMITS = {"STREAMRANK_DELIVERY__COMMIT_INTERVAL_MS": "1"}
"""An acknowledged batch's offsets are committed on the loop's next iteration (the default,
100 ms, lets a fast loop acknowledge any number of batches before it commits them): what a
kill can repeat is then bounded by the batches in flight (:func:`repeat_bound`)."""


def repeat_bound(env: dict[str, str], processes: int) -> int:
    """The most events a SIGKILL of ``processes`` scoring loops run with ``env`` can make the
    next run score again (at-least-once).

    Only events whose recommendations were produced but whose offsets were not committed when
    the loop died are scored again. With :data:`FAST_COMMITS`, per loop those are in at most:

    - the open batch, being published (1);
    - the sealed batches not yet acknowledged: the loop waits while there are more than
      ``batching.max_in_flight_batches`` of them (``max_in_flight + 1``);
    - the acknowledged batches of the last commit request, which librdkafka may not have sent
      before the kill (at most the ``max_in_flight + 1`` acknowledged since the commit before);

    and a batch holds at most ``max_batch_rows // min_candidates`` events (every test event has
    at least ``min_candidates`` rows, :data:`~tests.integration.conftest.WORLD`). The commits
    are asynchronous: the bound assumes each request is answered before the next is due, which
    a starved host can break (several unsent requests, all lost at the kill; RELIABILITY.md).

    Args:
        env: the run's settings overrides (``STREAMRANK_BATCHING__*``, ``STREAMRANK_DELIVERY__*``).
        processes: the loops that may die with uncommitted batches (ranks, ingest workers).

    Returns:
        The bound, in events.
    """
    assert env.items() >= FAST_COMMITS.items(), "the bound holds with FAST_COMMITS"
    defaults = BatchingSettings()
    rows = int(env.get("STREAMRANK_BATCHING__MAX_BATCH_ROWS", defaults.max_batch_rows))
    in_flight = int(
        env.get("STREAMRANK_BATCHING__MAX_IN_FLIGHT_BATCHES", defaults.max_in_flight_batches)
    )
    batches = 1 + 2 * (in_flight + 1)
    return processes * batches * (rows // WORLD.min_candidates)


def committed_positions(settings: Settings) -> dict[int, int]:
    """The input partitions' offsets committed by ``settings``' consumer group, as the broker
    has them now (a partition with no commit is absent). Read without joining the group."""
    topic = settings.topics.input
    consumer = make_consumer(settings.kafka.config, group_id=settings.kafka.group_id)
    try:
        partitions = [TopicPartition(topic, p) for p in range(settings.topics.partitions)]
        committed = consumer.committed(partitions, timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}


def input_positions(settings: Settings) -> dict[str, tuple[int, int]]:
    """Each valid event on the input topic: its ``event_id`` -> ``(partition, offset)``."""
    codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    positions: dict[str, tuple[int, int]] = {}
    for msg in read_messages(settings, settings.topics.input, timeout_s=10):
        try:
            event_id = codec.decode(msg.value())["event_id"]
        except Exception:  # an invalid event (a dead letter): no id
            continue
        positions[event_id] = (msg.partition(), msg.offset())
    return positions


def uncommitted_outputs(
    settings: Settings, outputs: list[dict[str, Any]], committed: dict[int, int]
) -> set[str]:
    """The events of ``outputs`` (a stopped run's recommendations) at or past their partition's
    ``committed`` offset: what at-least-once makes the next run score again, exactly."""
    positions = input_positions(settings)
    past: set[str] = set()
    for record in outputs:
        partition, offset = positions[record["event_id"]]
        if offset >= committed.get(partition, 0):
            past.add(record["event_id"])
    return past


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    """Poll ``condition`` every 0.1 s; fail the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def report(
    scenario: str,
    sent: set[str],
    recs: list[dict[str, Any]],
    recover_s: float,
    mode: str,
    aborted: int | None = None,
) -> tuple[int, int]:
    """Print ``RELIABILITY scenario events missing duplicates recover_s mode [aborted]``.

    Returns:
        (missing, duplicates): valid events with no recommendation, and extra recommendations.
    """
    counts = Counter(r["event_id"] for r in recs)
    missing = len(sent - set(counts))
    duplicates = sum(n - 1 for n in counts.values())
    print(
        f"\nRELIABILITY scenario={scenario} events={len(sent)} missing={missing} "
        f"duplicates={duplicates} recover_s={recover_s:.1f} mode={mode}"
        + ("" if aborted is None else f" aborted={aborted}")
    )
    return missing, duplicates


def audit_exactly_once(
    scenario: str, settings: Settings, sent: set[str], recover_s: float
) -> tuple[int, int, int]:
    """Read the output topic twice: ``read_committed`` (what consumers see) and
    ``read_uncommitted`` (aborted records too), and :func:`report` both.

    Returns:
        (missing, duplicates) under ``read_committed``, and the aborted records: those a
        ``read_uncommitted`` reader sees beyond the committed ones.
    """
    committed = collect(settings, expected=len(sent))
    everything = collect(settings, expected=len(committed), isolation_level="read_uncommitted")
    aborted = len(everything) - len(committed)
    missing, duplicates = report(scenario, sent, committed, recover_s, "exactly_once", aborted)
    return missing, duplicates, aborted


def open_transaction_records(settings: Settings) -> int:
    """Records on the output topic inside transactions not yet committed or aborted: the high
    watermark minus the last stable offset, summed over partitions."""
    topic = settings.topics.output
    admin = AdminClient(settings.kafka.config.admin)
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {}
    for level in (IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED):
        specs = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
        futures = admin.list_offsets(specs, isolation_level=level, request_timeout=10)
        ends[level] = sum(f.result().offset for f in futures.values())
    return ends[IsolationLevel.READ_UNCOMMITTED] - ends[IsolationLevel.READ_COMMITTED]


def _group_members(settings: Settings) -> list[Any]:
    """The members of the pipeline's consumer group now (none while it has no coordinator)."""
    admin = AdminClient(settings.kafka.config.admin)
    group = settings.kafka.group_id
    try:
        description = admin.describe_consumer_groups([group])[group].result(timeout=10)
    except KafkaException:
        return []
    return list(description.members)


def members_with_partitions(settings: Settings) -> int:
    """Members of the pipeline's consumer group that own input partitions now (0 while the
    group has no coordinator yet or rebalances)."""
    return sum(
        any(tp.topic == settings.topics.input for tp in member.assignment.topic_partitions)
        for member in _group_members(settings)
    )


def group_members(settings: Settings) -> int:
    """Members of the pipeline's consumer group now, live or not (0 while it has no
    coordinator yet).

    A member killed with SIGKILL stays a member until its session times out
    (``kafka.session_timeout_ms``); one killed while it was rejoining a rebalance is even
    part of the next generation and keeps partitions there until then. A restarted run that
    must score everything waits for this to reach 0 before it starts.
    """
    return len(_group_members(settings))


def dead_letters(consumer: Consumer, expected: int, timeout_s: float = 60) -> list[Message]:
    """Records of the DLQ ``consumer`` reads, until ``expected`` arrived or ``timeout_s``."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expected and time.monotonic() < deadline:
        out += [m for m in consumer.consume(100, 0.5) if m.error() is None]
    return out


def seeded_settings(
    settings_factory: Callable[..., Settings],
    checkpoint: Path,
    world: SyntheticWorld,
    **sections: Any,
) -> Settings:
    """Fresh topics and the test model, with ``sections`` overridden and features seeded."""
    settings = settings_factory(model=model_settings(checkpoint), synthetic=WORLD, **sections)
    seed_features(settings, world)
    return settings


def start_run(
    cli: Cli,
    settings: Settings,
    log: Path,
    env: dict[str, str],
    *args: str,
    outputs: int = 300,
) -> subprocess.Popen:
    """Start ``run ARGS`` and wait until it has produced ``outputs`` records (failing the
    test if it exits first or never gets there)."""
    out = log.open("w")
    proc = cli(settings, "run", *args, extra_env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_for_outputs(settings, at_least=outputs, proc=proc, log=log)
    return proc


def expected_exit(sig: signal.Signals) -> int:
    """A run's exit status after ``sig``: 0 when it stops cleanly (SIGTERM/SIGINT), else
    death by the signal (``Popen`` reports -N)."""
    return 0 if sig in (signal.SIGTERM, signal.SIGINT) else -sig


def signal_run(
    proc: subprocess.Popen, settings: Settings, log: Path, sig: signal.Signals, total: int
) -> float:
    """Send ``sig`` to ``proc`` alone and wait for its exit with the status ``sig`` calls for.

    Asserts the fault is real: ``proc`` is still running when the signal is sent, and fewer
    than ``total`` outputs were produced by then (the signal lands mid-stream).

    Returns:
        Seconds from the signal to the exit.
    """
    seen = produced_count(settings)
    assert proc.poll() is None, f"exited ({proc.returncode}) before {sig.name}\n{_tail(log)}"
    assert seen < total, f"{sig.name} came too late ({seen} of {total} produced)"
    sent_at = time.monotonic()
    proc.send_signal(sig)
    code = proc.wait(60)
    exit_s = time.monotonic() - sent_at
    assert code == expected_exit(sig), f"exit status {code} after {sig.name}\n{_tail(log)}"
    return exit_s


def signal_mid_stream(
    cli: Cli,
    settings: Settings,
    log: Path,
    env: dict[str, str],
    sig: signal.Signals,
    total: int,
) -> float:
    """Start ``run``, send ``sig`` once 300 recommendations are out (:func:`signal_run`).

    Returns:
        Seconds from the signal to the exit.
    """
    return signal_run(start_run(cli, settings, log, env), settings, log, sig, total)


def kafka_ctl(action: str, stack: LocalStack) -> None:
    """``scripts/kafka_ctl.sh stop|kill|start`` on the session's broker (start waits until it
    accepts connections again)."""
    subprocess.run(
        [str(REPO_ROOT / "scripts" / "kafka_ctl.sh"), action, str(stack.directory)],
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=180,
    )


@contextmanager
def broker_down(stack: LocalStack, action: str) -> Iterator[None]:
    """The broker down (``action``: ``stop``, or ``kill`` for a crash) for the ``with`` block;
    started again on leaving it, even when the test fails: the session needs it."""
    try:
        kafka_ctl(action, stack)
        yield
    finally:
        kafka_ctl("start", stack)


def _tail(log: Path) -> str:
    return failure_excerpt(log) if log.exists() else ""


def run_until_idle(
    cli: Cli, settings: Settings, log: Path, env: dict[str, str], *args: str, idle_s: float = 4
) -> float:
    """Run the pipeline (``run ARGS``) until ``idle_s`` without input (it must exit 0).
    Returns its seconds."""
    started = time.monotonic()
    proc = cli(
        settings,
        "run",
        "--exit-when-idle",
        f"{idle_s:g}",
        *args,
        extra_env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    assert proc.wait(300) == 0, _tail(log)
    return time.monotonic() - started


def restart_and_report(
    cli: Cli,
    settings: Settings,
    log: Path,
    env: dict[str, str],
    sent: set[str],
    scenario: str,
    *args: str,
    recover_s: float | None = None,
    idle_s: float = 4,
) -> tuple[int, int, float]:
    """After a fault: run the pipeline again until idle (:func:`run_until_idle`, ``run ARGS``),
    read every output and :func:`report` the at-least-once ``scenario``.

    Args:
        sent: the ids of the valid events sent.
        recover_s: the figure reported as ``recover_s`` (default: the restart's seconds).

    Returns:
        ``(missing, duplicates, seconds the restart ran)``.
    """
    run_s = run_until_idle(cli, settings, log, env, *args, idle_s=idle_s)
    recs = collect(settings, expected=len(sent))
    shown = run_s if recover_s is None else recover_s
    missing, duplicates = report(scenario, sent, recs, shown, "at_least_once")
    return missing, duplicates, run_s
