"""``streamrank bench swap``: the end-to-end latency around a live model swap, under load.

1. A temporary versions directory holds two versions of the configured model (untrained, seeds
   0 and 1: the same shapes, so the same load and warm-up work as the served model); the first
   is current.
2. ``streamrank run [--nproc N]`` (a child process) serves it from fresh topics, following the
   directory (``model_swap.poll_interval_s``); a few warm-up events make sure it is scoring.
3. A producer (a thread of this process; the pipeline is another process) offers ``rate``
   events/s for ``seconds``; ``swap_at_s`` after it started, the second version is promoted.
4. Once everything is scored, the pipeline gets SIGTERM; every input record (partition, offset,
   ``event_time``) and every Recommendation (``scored_at``, ``model_version``) is read back.

Latency of an event is ``scored_at - event_time`` (both stamped by the processes, ms). The
events are split by ``event_time`` into windows: ``before`` the promotion, ``loading`` (from
the promotion to ``window_s`` before the first output of the new version: the background load),
``swap`` (``window_s`` either side of that first output: the drain, the loop's pause and the
warm-up) and ``after``; each gets its count, p50, p99 and max. The audit: missing and repeated
events, and whether every input partition's outputs switch version once, in order. The
pipeline's own log line gives the loop's pause (``the loop paused ...``).

Example::

    result = bench_swap(settings, SwapPlan(rate=200, seconds=30, swap_at_s=10))
    result["windows"]["swap"]["p99_ms"]
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from model.ranker import build_ranker
from model.store.versions import ModelVersions, NoCurrentVersionError, resolve_checkpoint
from model.synthetic import SyntheticWorld
from pipeline.connectors.avro.reference import (
    RECOMMENDATION_SCHEMA_FILE,
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
)
from pipeline.connectors.avro.rules import epoch_millis
from pipeline.connectors.kafka.clients import ensure_topics
from pipeline.settings.loading import Settings
from pipeline.tools.bench.common import child_env, fresh_topics, seeded_world, streamrank_command
from pipeline.tools.bench.soak.probe import topic_messages
from pipeline.tools.synthetic_io import produce_events

START_TIMEOUT_S = 300.0
WARM_EVENTS = 50
OLD, NEW = "bench-swap-a", "bench-swap-b"
_PAUSE = re.compile(r"the loop paused (\d+\.\d+)s")


@dataclass(frozen=True)
class SwapPlan:
    """How hard, how long, and when to promote."""

    rate: float = 200.0
    """Events per second offered."""
    seconds: float = 30.0
    """How long the producer runs."""
    swap_at_s: float = 10.0
    """Seconds after the producer starts at which the new version is promoted."""
    window_s: float = 2.0
    """Half-width of the ``swap`` window around the first output of the new version."""
    nproc: int = 1
    """Ranks of ``streamrank run``."""
    poll_interval_s: float = 0.5
    """``model_swap.poll_interval_s`` of the pipeline."""


@dataclass(frozen=True)
class InputRecord:
    partition: int
    offset: int
    event_time_ms: int


@dataclass(frozen=True)
class OutputRecord:
    scored_at_ms: int
    model_version: str


def swap_windows(
    inputs: dict[str, InputRecord],
    outputs: dict[str, list[OutputRecord]],
    promoted_ms: int,
    window_s: float,
    since_ms: int,
    new_version: str = NEW,
) -> dict[str, Any]:
    """Latency per window and the audit (see the module docstring).

    Args:
        inputs: event id -> where and when it was produced.
        outputs: event id -> its Recommendations (more than one: a repeat).
        promoted_ms: when the new version was promoted (epoch ms).
        window_s: half-width of the ``swap`` window.
        since_ms: events before this (the warm-up) are not measured.
        new_version: the promoted version's name.

    Returns:
        ``windows`` (name -> ``events``, ``p50_ms``, ``p99_ms``, ``max_ms``), ``first_new_ms``
        (the first output of the new version, ms after the promotion), ``missing``,
        ``duplicates``, ``switched_once`` and ``versions``.
    """
    measured = {e: r for e, r in inputs.items() if r.event_time_ms >= since_ms}
    missing = sum(1 for e in measured if e not in outputs)
    duplicates = sum(len(outputs[e]) - 1 for e in measured if e in outputs)
    new_times = [
        o.scored_at_ms for outs in outputs.values() for o in outs if o.model_version == new_version
    ]
    first_new = min(new_times) if new_times else None
    half = int(window_s * 1000)
    edges = (
        (promoted_ms, first_new - half, first_new + half)
        if first_new is not None
        else (promoted_ms, promoted_ms, promoted_ms)
    )
    names = ("before", "loading", "swap", "after")
    latencies: dict[str, list[int]] = {name: [] for name in names}
    per_partition: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for event_id, record in measured.items():
        outs = outputs.get(event_id)
        if not outs:
            continue
        first = min(outs, key=lambda o: o.scored_at_ms)
        t = record.event_time_ms
        if t < edges[0]:
            name = "before"
        elif t < max(edges[0], edges[1]):
            name = "loading"
        else:
            name = "swap" if t <= edges[2] else "after"
        latencies[name].append(first.scored_at_ms - t)
        per_partition[record.partition].append((record.offset, first.model_version))
    switched = True
    for pairs in per_partition.values():
        seen = [v for _, v in sorted(pairs)]
        cut = seen.index(new_version) if new_version in seen else len(seen)
        switched = switched and all(v == new_version for v in seen[cut:])
    return {
        "windows": {name: _stats(latencies[name]) for name in names},
        "first_new_ms": None if first_new is None else first_new - promoted_ms,
        "events": len(measured),
        "missing": missing,
        "duplicates": duplicates,
        "switched_once": switched and first_new is not None,
        "versions": sorted({o.model_version for outs in outputs.values() for o in outs}),
    }


def _stats(values: list[int]) -> dict[str, Any]:
    if not values:
        return {"events": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    array = np.asarray(values, dtype=np.float64)
    return {
        "events": len(values),
        "p50_ms": round(float(np.percentile(array, 50)), 1),
        "p99_ms": round(float(np.percentile(array, 99)), 1),
        "max_ms": round(float(array.max()), 1),
    }


def bench_swap(
    settings: Settings, plan: SwapPlan, report: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the benchmark of the module docstring.

    Args:
        settings: the stack and the pipeline's configuration (the children get it through the
            environment; ``STREAMRANK_CONFIG`` for a config file); the model's spec comes from
            ``model.checkpoint`` when one is there, else from ``[model]``.
        plan: rate, duration, when to promote.
        report: called with one line of progress per phase.

    Returns:
        The plan, :func:`swap_windows`'s figures, the loop's pause per rank (from the log) and
        the pipeline's exit code.
    """
    world = seeded_world(settings)
    topics, tag = fresh_topics(settings)
    ensure_topics(settings.kafka.config, topics)
    run_settings = settings.model_copy(update={"topics": topics})
    group = f"bench-swap-{tag}"
    with tempfile.TemporaryDirectory(prefix="streamrank-swap-") as tmp:
        versions = _two_versions(settings, Path(tmp) / "models")
        log_path = Path(tmp) / "pipeline.log"
        env = child_env(
            topics,
            group,
            STREAMRANK_MODEL__CHECKPOINT=str(versions.root),
            STREAMRANK_MODEL_SWAP__ENABLED="true",
            STREAMRANK_MODEL_SWAP__POLL_INTERVAL_S=str(plan.poll_interval_s),
            COLUMNS="400",
        )
        with log_path.open("wb") as log:
            pipeline = _start(streamrank_command("run", "--nproc", str(plan.nproc)), env, log)
            try:
                produce_events(run_settings, world, WARM_EVENTS)
                _wait_scored(run_settings, WARM_EVENTS, pipeline, START_TIMEOUT_S)
                events = max(1, round(plan.rate * plan.seconds))
                report(f"{events} events at {plan.rate:g}/s, promoted after {plan.swap_at_s:g}s")
                producer = _Producer(run_settings, world, events, plan.rate)
                since_ms = producer.start()
                time.sleep(max(0.0, since_ms / 1000 + plan.swap_at_s - time.time()))
                promoted_ms = int(time.time() * 1000)
                versions.promote(NEW)
                report(f"promoted {NEW}")
                producer.join(plan.seconds * 3 + 120)
                _wait_scored(run_settings, WARM_EVENTS + events, pipeline, 300.0)
                pipeline.send_signal(signal.SIGTERM)
                pipeline_exit = pipeline.wait(settings.shutdown.timeout_s + 60)
            finally:
                if pipeline.poll() is None:
                    os.killpg(pipeline.pid, signal.SIGKILL)
                    pipeline.wait(30)
        text = " ".join(log_path.read_text(errors="replace").split())  # lines unwrapped
        pauses = [float(m) for m in _PAUSE.findall(text)]
    inputs, outputs = _read_back(run_settings)
    result = swap_windows(inputs, outputs, promoted_ms, plan.window_s, since_ms)
    return {
        "plan": asdict(plan),
        **result,
        "loop_pause_s": pauses,
        "pipeline_exit": pipeline_exit,
    }


class _Producer:
    """``produce_events`` at ``rate`` on a thread of this process (the pipeline is another
    process); what it raised is raised by :meth:`join`."""

    def __init__(self, settings: Settings, world: SyntheticWorld, events: int, rate: float) -> None:
        self._args = (settings, world, events, rate)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="bench-producer", daemon=True)

    def start(self) -> int:
        """Start producing; returns the time it started (epoch ms)."""
        started = int(time.time() * 1000)
        self._thread.start()
        return started

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError(f"the producer did not finish within {timeout_s:.0f}s")
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        settings, world, events, rate = self._args
        try:
            produce_events(settings, world, events, rate=rate)
        except BaseException as exc:
            self._error = exc


def _two_versions(settings: Settings, root: Path) -> ModelVersions:
    """The configured model's shapes, twice (untrained: seeds 0 and 1); the first current."""
    from model.store.checkpoint import load_meta

    try:
        spec = load_meta(resolve_checkpoint(settings.model.checkpoint)).spec
    except (FileNotFoundError, NoCurrentVersionError, ValueError):
        spec = settings.model.feature_spec()
    versions = ModelVersions.create(root)
    versions.write(build_ranker(spec, seed=0), spec, version=OLD, promote=True)
    versions.write(build_ranker(spec, seed=1), spec, version=NEW)
    return versions


def _start(args: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _wait_scored(
    settings: Settings, expected: int, pipeline: subprocess.Popen[bytes], timeout_s: float
) -> None:
    """Until ``expected`` Recommendations are on the output topic (its high watermarks)."""
    from confluent_kafka import KafkaException, TopicPartition

    from pipeline.connectors.kafka.clients import make_consumer

    topic = settings.topics.output
    consumer = make_consumer(settings.kafka.config, group_id=f"bench-swap-count-{os.getpid()}")
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if pipeline.poll() is not None:
                raise RuntimeError(f"the pipeline exited with {pipeline.returncode}")
            try:
                partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
                count = sum(
                    consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                    for p in partitions
                )
            except KafkaException:
                count = 0  # a topic created a moment ago: no leaders yet
            if count >= expected:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} of {expected} recommendations after {timeout_s:.0f}s")
            time.sleep(0.5)
    finally:
        consumer.close()


def _read_back(
    settings: Settings,
) -> tuple[dict[str, InputRecord], dict[str, list[OutputRecord]]]:
    events = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    recs = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, settings.topics.output)
    inputs: dict[str, InputRecord] = {}
    for partition, offset, value in topic_messages(settings.kafka, settings.topics.input):
        record = events.decode(value)
        inputs[record["event_id"]] = InputRecord(
            partition, offset, epoch_millis(record["event_time"])
        )
    outputs: dict[str, list[OutputRecord]] = defaultdict(list)
    for _, _, value in topic_messages(settings.kafka, settings.topics.output):
        rec = recs.decode(value)
        outputs[rec["event_id"]].append(
            OutputRecord(epoch_millis(rec["scored_at"]), rec["model_version"])
        )
    return inputs, dict(outputs)
