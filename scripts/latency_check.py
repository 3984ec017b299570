"""An independent latency check: the pipeline timed from outside, by the records on its topics.

Unlike ``streamrank bench latency`` (which offers load from inside and reads the pipeline's own
measurements), this drives only the CLI and reads the topics (issue 30's independent check):

1. capacity: ``streamrank produce`` puts a backlog of ``--capacity-events`` events on fresh
   topics, then ``streamrank run --exit-when-idle`` drains it; the capacity is the events over
   the span of their output records' timestamps;
2. load: on fresh topics and a fresh group, ``streamrank run`` is started, and
   ``streamrank produce --wait-for-group --rate`` offers ``--load`` of that capacity for
   ``--seconds``, optionally beside ``--busy-cores`` processes spinning a core each;
3. each event's latency is its output record's timestamp (set when the pipeline produced it)
   minus its input record's timestamp (set when ``produce`` sent it), matched by ``event_id``.

Every process started here is ended by its pid; the topics are deleted at the end.

Usage (the stack running, ``source .stack/env``; the model as ``streamrank run`` finds it)::

    .venv/bin/python scripts/latency_check.py --load 0.5 --seconds 60
    .venv/bin/python scripts/latency_check.py --load 0.25 --busy-cores 1 --json
    .venv/bin/python scripts/latency_check.py --capacity 1800 --logs /tmp/check  # keep logs
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from pipeline.connectors.avro.reference import (  # noqa: E402 - after the path
    RECOMMENDATION_SCHEMA_FILE,
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
)
from pipeline.settings.loading import Settings, load_settings  # noqa: E402
from pipeline.tools.bench.common import (  # noqa: E402
    child_env,
    delete_topics,
    fresh_topics,
    streamrank_command,
)
from pipeline.tools.recommendation_reader import read_messages  # noqa: E402

SETTINGS: Settings = load_settings()  # the stack's connection and codec; each step's topics
"""are fresh (:func:`step_env`)."""


def step_env() -> dict[str, str]:
    """Fresh input, output and dead-letter topics and a fresh consumer group for one step."""
    topics, tag = fresh_topics(SETTINGS)
    return child_env(topics, f"check-{tag}")


LOGS = Path(".")
"""Where each child's stderr goes (``--logs``, else a temporary directory, set by :func:`main`):
a file, never an unread pipe, which a child that logs more than the pipe holds would block on
in the middle of the measurement."""


def cli(env: dict[str, str], name: str, *args: str) -> subprocess.Popen[bytes]:
    """``streamrank ARGS`` with ``env``, its stderr in ``LOGS/NAME.log``."""
    with (LOGS / f"{name}.log").open("wb") as log:  # the child holds its own descriptor
        return subprocess.Popen(
            streamrank_command(*args), cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
            stderr=log,
        )  # fmt: skip


def finish(proc: subprocess.Popen[bytes], name: str, timeout_s: float) -> None:
    """Wait for ``proc`` (started as ``name``); fail with the tail of its log if it does not
    exit 0."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SystemExit(f"latency_check: {name} did not end within {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        text = (LOGS / f"{name}.log").read_text(errors="replace")
        tail = text.strip().splitlines()[-5:]
        raise SystemExit(f"latency_check: {name} exited {proc.returncode}: " + " | ".join(tail))


def read_topic(topic: str, schema: Path) -> tuple[dict[str, int], int]:
    """``event_id`` -> the record's timestamp (ms) for every record of ``topic``, and how many
    records repeated an ``event_id`` already seen."""
    codec = RecordCodec(SETTINGS.codec, schema, topic)
    stamps: dict[str, int] = {}
    repeated = 0
    for msg in read_messages(SETTINGS, topic, timeout_s=15):
        event_id = codec.decode(msg.value() or b"")["event_id"]
        repeated += event_id in stamps
        stamps[event_id] = msg.timestamp()[1]
    return stamps, repeated


def drop_topics(env: dict[str, str]) -> None:
    names = ("INPUT", "OUTPUT", "DLQ")
    delete_topics(SETTINGS, [env[f"STREAMRANK_TOPICS__{name}"] for name in names])


def measure_capacity(events: int) -> float:
    """Events per second over the span of the output timestamps of a drained backlog."""
    env = step_env()
    try:
        backlog = cli(env, "produce-backlog", "produce", "--events", str(events))
        finish(backlog, "produce-backlog", 300)
        finish(cli(env, "run-drain", "run", "--exit-when-idle", "3"), "run-drain", 600)
        out, _ = read_topic(env["STREAMRANK_TOPICS__OUTPUT"], RECOMMENDATION_SCHEMA_FILE)
        stamps = np.array(list(out.values()))
    finally:
        drop_topics(env)
    if len(stamps) < events:
        raise SystemExit(f"latency_check: the drain produced {len(stamps)} of {events} outputs")
    span_s = (stamps.max() - stamps.min()) / 1000
    return float(len(stamps) / max(span_s, 1e-3))


def measure_load(
    rate: float, seconds: float, busy_cores: int, window_s: float = 10.0
) -> dict[str, Any]:
    """Offer ``rate`` events/s for ``seconds`` and time every event from its two records (and
    the p99 of each ``window_s`` of the load)."""
    env = step_env()
    events = max(1, int(rate * seconds))
    busy: list[subprocess.Popen[bytes]] = []
    run = cli(env, "run-load", "run", "--exit-when-idle", "5")
    try:
        busy = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy_cores)
        ]
        args = ["produce", "--wait-for-group", "--events", str(events), "--rate", f"{rate:.1f}"]
        finish(cli(env, "produce-load", *args), "produce-load", seconds * 3 + 300)
        for proc in busy:
            proc.kill()
            proc.wait()
        busy = []
        finish(run, "run-load", 300)
        sent, _ = read_topic(env["STREAMRANK_TOPICS__INPUT"], USER_EVENT_SCHEMA_FILE)
        out, repeated = read_topic(env["STREAMRANK_TOPICS__OUTPUT"], RECOMMENDATION_SCHEMA_FILE)
    finally:
        for proc in [*busy, run]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        drop_topics(env)
    matched = [(sent[i], out[i] - sent[i]) for i in sent if i in out]
    pairs = np.array(matched, dtype=np.float64).reshape(-1, 2)
    latency = pairs[:, 1]
    return {
        "offered_per_s": round(rate, 1),
        "seconds": seconds,
        "busy_cores": busy_cores,
        "events": len(sent),
        "outputs": len(out),
        "missing": len(set(sent) - set(out)),
        "duplicates": repeated,
        "p50_ms": float(np.percentile(latency, 50)) if len(latency) else None,
        "p99_ms": float(np.percentile(latency, 99)) if len(latency) else None,
        "max_ms": float(latency.max()) if len(latency) else None,
        "p99_ms_by_window": windows(pairs[:, 0], latency, window_s),
    }


def windows(sent_ms: np.ndarray, latency: np.ndarray, span_s: float) -> list[float]:
    """The p99 latency of the events sent in each ``span_s`` window, in order from the first
    event sent (where in the run the slow events are: its start, or throughout)."""
    if not len(latency):
        return []
    index = ((sent_ms - sent_ms.min()) // (span_s * 1000)).astype(np.int64)
    return [
        round(float(np.percentile(latency[index == i], 99)), 1)
        for i in range(int(index.max()) + 1)
        if (index == i).any()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity-events", type=int, default=6000)
    parser.add_argument("--capacity", type=float, help="events/s (skip measuring it)")
    parser.add_argument("--load", type=float, default=0.5, help="share of capacity offered")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--busy-cores", type=int, default=0)
    parser.add_argument("--window-s", type=float, default=10.0, help="span of a p99 window")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--logs", type=Path, help="keep each child's log in this directory")
    args = parser.parse_args()
    if not 0 < args.load <= 1:
        parser.exit(2, "latency_check: --load must be in (0, 1]\n")
    if args.window_s <= 0:
        parser.exit(2, "latency_check: --window-s must be above 0\n")
    global LOGS
    LOGS = args.logs or Path(tempfile.mkdtemp(prefix="latency_check-"))
    LOGS.mkdir(parents=True, exist_ok=True)
    try:
        capacity = args.capacity or measure_capacity(args.capacity_events)
        result = {"capacity_per_s": round(capacity, 1), "load": args.load}
        rate = capacity * args.load
        result.update(measure_load(rate, args.seconds, args.busy_cores, args.window_s))
    finally:
        if args.logs is None:
            shutil.rmtree(LOGS, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"capacity {result['capacity_per_s']} events/s; offered {result['offered_per_s']}/s "
        f"for {args.seconds:g} s beside {args.busy_cores} busy core(s): {result['events']} "
        f"events, {result['missing']} missing, {result['duplicates']} repeated; "
        f"p50 {result['p50_ms']:.0f} ms, p99 {result['p99_ms']:.0f} ms, "
        f"max {result['max_ms']:.0f} ms; p99 per {args.window_s:g} s: "
        + ", ".join(f"{p:.0f}" for p in result["p99_ms_by_window"])
    )


if __name__ == "__main__":
    main()
