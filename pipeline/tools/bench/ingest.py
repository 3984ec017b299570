"""``streamrank bench ingest``: one process vs K ingest workers, interleaved, on the stack.

For each round and each K of ``--workers`` (0: one process does everything):

1. ``streamrank run`` with ``batching.ingest_workers = K`` starts on fresh topics and a fresh
   group, and joins it (every worker owns partitions, the group is stable);
2. the CPU time of the run's process and of each worker is read from ``/proc/<pid>/stat``;
3. N events are produced at once (a backlog that builds faster than it drains);
4. once the output topic holds N Recommendations the CPU times are read again, and the run is
   stopped (SIGTERM: every worker commits and exits) and its summary read.

Reported per K: events/s (the summary's: first input to last output), CPU per event of the
scoring process and of the workers (their sum, and per worker), and from them the events/s one
worker drains per second of CPU. Separately (:func:`transport_cost`), what passing one batch
costs: the worker's copy into its shared-memory slot, and the round trip to a scoring process
that reads the slot in place and answers (a spawned echo process, no model), against sending the
same arrays pickled through the pipe.

With ``[model.module]`` the runs serve the user's model: its version (the current one of
``model.checkpoint`` when that holds versions of the module, else the module freshly
initialised; ``model`` in the report says which), events synthesized from its schema, Redis
records from its layouts (:mod:`pipeline.tools.bench.workload`); the transport passes batches of
its own input layout, with the score columns its output publishes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import ConsumerGroupState, KafkaException

from model.features.layout import InputLayout
from model.features.spec import FeatureSpec
from model.module.output import DEFAULT_OUTPUT
from model.module.types import OutputConfig
from model.serving.device import serving_device
from pipeline.connectors.kafka.admin import make_admin
from pipeline.ingest.transport import ScoreReply, ScoreRequest, SharedSlot, SlotShape
from pipeline.settings.loading import CONFIG_ENV_VAR, Settings
from pipeline.tools.bench.common import (
    BenchTopics,
    child_env,
    record_count,
    streamrank_command,
)
from pipeline.tools.bench.model import describe_device
from pipeline.tools.bench.served import bench_checkpoint, checkpoint_env, model_identity
from pipeline.tools.bench.workload import Workload, workload

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads), from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def worker_pids(pid: int) -> list[int]:
    """The ingest workers of run process ``pid`` (children started by ``spawn_main``)."""
    from pipeline.jobs.lifetime import children

    out = []
    for child in children(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in command:
            out.append(child)
    return out


def wait_for_members(settings: Settings, group_id: str, members: int, timeout_s: float) -> None:
    """Block until ``group_id`` is stable with ``members`` members owning every partition."""
    admin = make_admin(settings.kafka.config, log_level=4)
    topic = settings.topics.input
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            group = admin.describe_consumer_groups([group_id], request_timeout=5)[group_id].result()
            total = len(admin.list_topics(topic, timeout=5).topics[topic].partitions)
        except (KafkaException, KeyError):
            time.sleep(0.2)
            continue
        owned = {
            tp.partition
            for m in group.members
            if m.assignment is not None
            for tp in m.assignment.topic_partitions
            if tp.topic == topic
        }
        if (
            group.state == ConsumerGroupState.STABLE
            and len(group.members) == members
            and len(owned) == total
        ):
            return
        time.sleep(0.2)
    raise TimeoutError(f"group {group_id} did not get {members} members in {timeout_s:g}s")


def _one_run(served: _Served, events: int, workers: int, topics: BenchTopics) -> dict[str, Any]:
    """One ``streamrank run`` of ``served``'s configuration with ``workers`` ingest workers over
    ``events`` new events."""
    settings = served.settings
    config = {} if served.config_file is None else {CONFIG_ENV_VAR: str(served.config_file)}
    run_topics, tag = topics.fresh(max(settings.topics.partitions, workers))
    group = f"bench-ingest-{tag}"
    run_settings = settings.model_copy(update={"topics": run_topics})
    with tempfile.TemporaryDirectory() as tmp:
        summary_file = Path(tmp) / "summary.json"
        env = child_env(
            run_topics,
            group,
            STREAMRANK_BATCHING__INGEST_WORKERS=str(workers),
            **served.env,
            **config,
        )
        command = streamrank_command(
            "run", "--exit-when-idle", "600", "--summary-json", str(summary_file)
        )
        proc = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            wait_for_members(run_settings, group, max(workers, 1), timeout_s=600)
            pids = worker_pids(proc.pid)
            before = {pid: cpu_seconds_of(pid) for pid in [proc.pid, *pids]}
            served.load.produce(run_settings, events)
            while record_count(run_settings, run_topics.output) < events:
                if proc.poll() is not None:
                    raise RuntimeError(f"the {workers}-worker run exited ({proc.returncode})")
                time.sleep(0.2)
            used = {pid: cpu_seconds_of(pid) - start for pid, start in before.items()}
            proc.send_signal(signal.SIGTERM)
            if proc.wait(120) != 0:
                raise RuntimeError(f"the {workers}-worker run failed ({proc.returncode})")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        summary = json.loads(summary_file.read_text())
    if summary["events_out"] != events:
        raise RuntimeError(f"the {workers}-worker run scored {summary['events_out']} of {events}")
    per_event = 1e6 / events
    return {
        "events_per_s": summary["events_per_s"],
        "rank_cpu_us": used[proc.pid] * per_event,
        "workers_cpu_us": sum(used[pid] for pid in pids) * per_event,
        "per_worker_cpu_s": [used[pid] for pid in pids],
    }


def _echo(conn: Connection, slots: list[SharedSlot], keys: tuple[str, ...]) -> None:
    """A scoring process without a model: read the requested slot in place, answer."""
    while True:
        message = conn.recv()
        if message is None:
            return
        if isinstance(message, ScoreRequest):
            slots[message.slot].read(message, keys)
            conn.send(ScoreReply(message.slot))
        else:  # pickled arrays (the alternative measured)
            conn.send(ScoreReply(0))


def transport_cost(
    inputs: FeatureSpec | InputLayout,
    output: OutputConfig,
    load: Workload,
    rows: int,
    batches: int = 200,
) -> dict[str, float]:
    """What passing one batch of about ``rows`` rows to the scoring process costs.

    Args:
        inputs: the model's feature spec (built-in) or input layout (configured).
        output: its output config (the score columns a slot carries back).
        load: where the batch comes from.
        rows: rows per batch (``batching.max_batch_rows``).
        batches: batches timed.

    Returns:
        ``rows_per_batch``, ``events_per_batch``, ``copy_us`` (into the slot),
        ``round_trip_us`` (request, the server's view of the slot, reply), their sum per batch
        and per event, and ``pickled_us`` (the same arrays sent pickled, with the reply).
    """
    import torch.multiprocessing as mp

    batch = load.batches(inputs, rows, 1)[0]
    inp = batch.model_input
    slots = [SharedSlot.allocate(SlotShape.for_model(inputs, output, max(rows, inp.num_rows)))]
    keys = tuple(inp.sparse.keys())
    context = mp.get_context("spawn")
    ours, theirs = context.Pipe(duplex=True)
    echo = context.Process(target=_echo, args=(theirs, slots, keys), daemon=True)
    echo.start()
    theirs.close()
    try:
        # One untimed exchange first: the spawned process imports torch before it answers.
        ours.send(slots[0].write(inp, 0))
        ours.recv()
        copy = trip = pickled = 0.0
        for _ in range(batches):
            start = time.perf_counter()
            request = slots[0].write(inp, 0)
            copied = time.perf_counter()
            ours.send(request)
            ours.recv()
            done = time.perf_counter()
            arrays = (inp.dense.numpy(), inp.sparse.values().numpy(), inp.sparse.lengths().numpy())
            ours.send(arrays)
            ours.recv()
            pickled += time.perf_counter() - done
            copy += copied - start
            trip += done - copied
        ours.send(None)
        echo.join(30)
    finally:
        if echo.is_alive():
            echo.kill()
            echo.join(10)
        ours.close()
    per_batch = 1e6 / batches
    events = batch.events
    return {
        "rows_per_batch": inp.num_rows,
        "events_per_batch": events,
        "copy_us": round(copy * per_batch, 1),
        "round_trip_us": round(trip * per_batch, 1),
        "us_per_batch": round((copy + trip) * per_batch, 1),
        "us_per_event": round((copy + trip) * per_batch / events, 2),
        "pickled_us": round(pickled * per_batch, 1),
    }


@dataclass
class _Served:
    """One model a benchmark runs: its settings (``model.checkpoint`` the version served), its
    workload, its config file for the child processes, and what it is."""

    settings: Settings
    load: Workload
    config_file: Path | None
    env: dict[str, str]
    inputs: FeatureSpec | InputLayout
    output: OutputConfig
    about: dict[str, Any]


def _served(settings: Settings, config_file: Path | None, stack: ExitStack) -> _Served:
    """The model ``settings`` configure, its features seeded and its checkpoint chosen
    (:func:`~pipeline.tools.bench.served.bench_checkpoint`)."""
    load = workload(settings)
    served, checkpoint, notes = stack.enter_context(bench_checkpoint(settings))
    if settings.model.module is None:
        from model.store.checkpoint import load_meta

        meta = load_meta(checkpoint)
        inputs: FeatureSpec | InputLayout = meta.spec
        output, version = DEFAULT_OUTPUT, meta.model_version
    else:
        from model.module.store import load_module_meta
        from pipeline.models.preflight import configured_module

        config, fmap = configured_module(settings)
        inputs, output = fmap.layout, config.output
        version = load_module_meta(checkpoint).model_version
    about = {
        "config": None if config_file is None else str(config_file),
        "model": model_identity(settings, version),
        "notes": notes,
    }
    env = checkpoint_env(settings, checkpoint, notes)
    return _Served(served, load, config_file, env, inputs, output, about)


def _figures(runs: dict[int, list[dict[str, Any]]], workers: tuple[int, ...]) -> dict[str, Any]:
    """Per K and round, their medians, and the events one worker drains per CPU second."""
    out: dict[str, Any] = {}
    keys = {
        "events_per_s": "events_per_s",
        "rank_cpu_us_per_event": "rank_cpu_us",
        "workers_cpu_us_per_event": "workers_cpu_us",
    }
    for name, key in keys.items():
        out[name] = {str(k): [round(r[key], 2) for r in runs[k]] for k in workers}
    out["per_worker_cpu_s"] = {
        str(k): [[round(v, 3) for v in r["per_worker_cpu_s"]] for r in runs[k]] for k in workers
    }
    out["median"] = {
        str(k): {name: round(float(np.median(out[name][str(k)])), 2) for name in keys}
        for k in workers
    }
    out["worker_events_per_cpu_s"] = {
        str(k): round(1e6 / out["median"][str(k)]["workers_cpu_us_per_event"], 1)
        for k in workers
        if k and out["median"][str(k)]["workers_cpu_us_per_event"]
    }
    return out


def bench_ingest(
    settings: Settings,
    *,
    workers: tuple[int, ...],
    events: int,
    rounds: int,
    report: Callable[[str], None] = print,
    keep_topics: bool = False,
    config_file: Path | None = None,
    versus: tuple[Settings, Path] | None = None,
) -> dict[str, Any]:
    """One process vs K ingest workers (see the module docstring).

    Args:
        settings: the stack and the pipeline (the built-in model: ``model.checkpoint`` must
            hold one; ``[model.module]``: its version, or the module untrained).
        workers: the K to compare, e.g. ``(0, 1, 2)``.
        events: events per run.
        rounds: interleaved rounds over ``workers``.
        report: called with one line per run.
        keep_topics: keep the runs' topics.
        config_file: the config file of ``settings`` (the runs read it).
        versus: another configuration and its file (e.g. one without ``[model.module]``: the
            built-in model), run after each run of ``settings`` with the same K and events:
            the two interleaved (``versus`` in the report).

    Returns:
        Per K (as a string) and round: ``events_per_s``, ``rank_cpu_us_per_event`` (the
        scoring process), ``workers_cpu_us_per_event`` (all workers), ``per_worker_cpu_s``
        (how the work was spread), their medians, ``worker_events_per_cpu_s`` (events one
        worker drains per second of one core: 1e6 / the workers' CPU per event),
        ``transport`` (:func:`transport_cost`), ``model`` (whose figures) and, with
        ``versus``, the same figures of the other model under ``versus``.

    Example::

        bench_ingest(settings, workers=(0, 1, 2), events=20_000, rounds=3)["median"]
    """
    with ExitStack() as stack:
        main = _served(settings, config_file, stack)
        other = None if versus is None else _served(versus[0], versus[1], stack)
        models = [main] if other is None else [main, other]
        runs: list[dict[int, list[dict[str, Any]]]] = [{k: [] for k in workers} for _ in models]
        with BenchTopics(settings, keep_topics) as topics:
            for r in range(rounds):
                for k in workers:
                    for served, done in zip(models, runs, strict=True):
                        result = _one_run(served, events, k, topics)
                        done[k].append(result)
                        report(
                            f"round {r + 1}: {served.about['model']['factory']} {k} worker(s) "
                            f"{result['events_per_s']:,.0f} events/s, CPU per event "
                            f"{result['rank_cpu_us']:.1f} us scoring process + "
                            f"{result['workers_cpu_us']:.1f} us workers"
                        )
        transport = transport_cost(
            main.inputs, main.output, main.load, settings.batching.max_batch_rows
        )
    report(
        f"transport: {transport['us_per_batch']} us per batch of "
        f"{transport['events_per_batch']} events, {transport['us_per_event']} us per event"
    )
    out: dict[str, Any] = {"events": events, "rounds": rounds, "workers": list(workers)}
    out.update(_figures(runs[0], workers))
    out["transport"] = transport
    out.update(main.about)
    out.update(describe_device(serving_device(settings.model.device, 0)))
    if other is not None:
        out["versus"] = {**other.about, **_figures(runs[1], workers)}
    return out
