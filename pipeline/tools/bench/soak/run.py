"""``streamrank bench soak``: a long run at a fraction of capacity; memory, lag and latency must
stay flat and nothing may be lost.

1. **capacity**: unless a rate is given, ``capacity_events`` events are produced to fresh topics
   and scored by ``streamrank run`` (a child process, like the soak's pipeline) until idle; its
   events/s is the capacity.
2. **soak**: on fresh topics, ``streamrank run`` runs as a child process with metrics on a free
   port, and a separate ``streamrank produce --rate`` process offers ``load`` x capacity events/s
   for ``minutes``. Every ``sample_s`` the soak samples the pipeline process's RSS, its group's
   consumer lag and the p99 end-to-end latency of the events scored since the previous sample
   (:mod:`pipeline.tools.bench.soak.probe`).
3. **drain and audit**: once the producer is done, samples continue until every event is
   scored or the lag is 0 (at most ``drain_s``); the pipeline gets SIGTERM (it commits what it
   scored); the lag is measured once more; every event id on the input topic must have a
   Recommendation on the output topic.
4. **checks**: RSS after ``warmup_s`` under load fitted with a line (:mod:`.soak_trend`: MiB per
   hour, projected growth over 24 h under ``max_growth_24h`` from the later half's fit, and
   whether the climb is ``flat``, ``filling`` toward a plateau or ``growing``); lag after
   warm-up at most ``max_lag_s`` seconds of input; lag 0 after the pipeline stopped; nothing
   missing; both children exit 0. The lag of the last
   sample before the stop (``idle_lag``: offsets still uncommitted while the input is idle) is
   reported, not checked.

Each sample also reads the CPU used by the pipeline's main thread and its other threads, the
broker, Redis and the producer (:mod:`.soak_sampler`); ``windows`` sets the windows whose p99
jumped against the median window (cores per process, RSS step). With ``trace`` the pipeline runs
under :mod:`.trace` (GC pauses, glibc's allocator, RSS every second; ``trace`` in the
report).

Writes ``soak.json`` (plan, samples, checks), ``soak.png`` (:mod:`~.soak_plot`) and the
children's logs to ``out_dir``.

With ``[model.module]`` the soak runs the user's model (its version, or the module freshly
initialised: ``model`` in ``soak.json``), ``streamrank produce`` synthesizes its events from its
schema, and the audit reads the event ids through its roles
(:mod:`pipeline.tools.bench.workload`).

Example::

    result = bench_soak(settings, SoakPlan(minutes=10, load=0.5), Path("artifacts/soak"))
    result["passed"]
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from pipeline.connectors.kafka.clients import ensure_topics
from pipeline.settings.loading import Settings
from pipeline.settings.topics import TopicsSettings
from pipeline.tools.bench.common import (
    child_env,
    fresh_topics,
    score_backlog,
    streamrank_command,
)
from pipeline.tools.bench.event_source import OutputFields, event_id_reader
from pipeline.tools.bench.served import bench_checkpoint, checkpoint_env, model_identity
from pipeline.tools.bench.soak import trace
from pipeline.tools.bench.soak.plan import SoakPlan, SoakRun, evaluate
from pipeline.tools.bench.soak.plot import plot_soak
from pipeline.tools.bench.soak.probe import consumer_lag, topic_event_ids
from pipeline.tools.bench.soak.sampler import (
    Sample,
    Sampler,
    first_scrape,
    sample_until,
    spike_windows,
)
from pipeline.tools.bench.workload import Workload, workload

TRACE_FILE = "trace.jsonl"


def measure_capacity(
    settings: Settings, load: Workload, events: int, env: dict[str, str] | None = None
) -> float:
    """Events/s of ``streamrank run`` scoring a backlog of ``events`` on fresh topics (``env``:
    more of its environment, e.g. the checkpoint it serves)."""
    topics, tag = fresh_topics(settings)
    load.produce(settings.model_copy(update={"topics": topics}), events)
    summary = score_backlog(topics, f"soak-capacity-{tag}", idle_s=2.0, env=env)[0]
    if summary["events_out"] < events:
        raise RuntimeError(f"capacity run scored {summary['events_out']} of {events} events")
    return float(summary["events_per_s"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(args: list[str], env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill a child (and anything it started) that is still running."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def _soak(
    settings: Settings,
    plan: SoakPlan,
    rate: float,
    events: int,
    out_dir: Path,
    report: Callable[[str], None],
    env: dict[str, str],
) -> SoakRun:
    """Phases 2 and 3 up to the pipeline's exit (the module docstring), children's output to
    ``pipeline.log`` / ``producer.log``; ``streamrank run`` writes ``pipeline-summary.json``
    (``env``: more of the children's environment)."""
    topics = settings.topics
    group, port = f"soak-{topics.input}", _free_port()
    metrics_env = {
        "STREAMRANK_METRICS__ENABLED": "true",
        "STREAMRANK_METRICS__HOST": "127.0.0.1",
        "STREAMRANK_METRICS__PORT": str(port),
        **env,
    }
    summary = out_dir / "pipeline-summary.json"
    summary.unlink(missing_ok=True)
    run = SoakRun()
    with (
        (out_dir / "pipeline.log").open("wb") as plog,
        (out_dir / "producer.log").open("wb") as log,
    ):
        run_args = ("run", "--summary-json", str(summary))
        command = (
            [sys.executable, "-m", trace.__name__, str(out_dir / TRACE_FILE), *run_args]
            if plan.trace
            else streamrank_command(*run_args)
        )
        pipeline = _start(command, child_env(topics, group, **metrics_env), plog)
        producer: subprocess.Popen[bytes] | None = None
        try:
            sampler = Sampler(settings, group, pipeline.pid, port, first_scrape(pipeline, port))
            report(f"soak: {events} events at {rate:,.1f} events/s for {plan.minutes:g} min")
            produce = ("produce", "--events", str(events), "--rate", f"{rate:.3f}")
            producer_env = child_env(topics, f"{group}-p", **env)
            producer = _start(streamrank_command(*produce), producer_env, log)
            sampler.others["producer"] = producer.pid
            run.started_at = sampler.started = time.monotonic()

            def loaded(_: Sample | None, producer: subprocess.Popen[bytes] = producer) -> bool:
                return producer.poll() is not None or pipeline.poll() is not None

            sample_until(sampler, loaded, plan.sample_s, "load", run.samples, report)
            drain_until = time.monotonic() + plan.drain_s

            def drained(last: Sample | None) -> bool:
                if pipeline.poll() is not None:
                    return True
                if last is None:
                    return False
                scored = last.recommendations >= events
                return scored or last.lag == 0 or time.monotonic() > drain_until

            sample_until(sampler, drained, min(plan.sample_s, 5.0), "drain", run.samples, report)
            if pipeline.poll() is None:
                pipeline.send_signal(signal.SIGTERM)
            run.pipeline_exit = pipeline.wait(settings.shutdown.timeout_s + 60)
            run.producer_exit = producer.poll()
            run.lag_after_stop = consumer_lag(settings.kafka, group, topics.input)
        finally:
            for child in (producer, pipeline):
                if child is not None:
                    _stop_group(child)
    return run


def _audit(settings: Settings, topics: TopicsSettings, run: SoakRun) -> None:
    """Compare the event ids on the input and output topics."""
    recs = OutputFields.of(settings)
    sent = topic_event_ids(settings.kafka, topics.input, event_id_reader(settings))
    out = topic_event_ids(
        settings.kafka, topics.output, lambda v: recs.event_id(recs.codec.decode(v))
    )
    run.events_on_input = sent.records
    run.missing = len(set(sent.counts) - set(out.counts))
    run.duplicates = out.records - len(out.counts)


def _served_version(settings: Settings, checkpoint: Path) -> str:
    """The model version of ``checkpoint`` (the built-in model's, or a configured module's)."""
    if settings.model.module is None:
        from model.store.checkpoint import load_meta

        return load_meta(checkpoint).model_version
    from model.module.store import load_module_meta

    return load_module_meta(checkpoint).model_version


def bench_soak(
    settings: Settings,
    plan: SoakPlan,
    out_dir: Path,
    report: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the soak described in the module docstring.

    Args:
        settings: the stack, the model checkpoint and the pipeline's configuration (children
            get the same through the environment; ``STREAMRANK_CONFIG`` for a config file).
        plan: duration, load and pass marks.
        out_dir: where ``soak.json``, ``soak.png`` and the logs go (created).
        report: called with one line of progress per phase and sample.

    Returns:
        The plan, the rate, every sample, :func:`evaluate`'s figures and checks, the
        pipeline's run summary and the paths written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    load = workload(settings)
    with bench_checkpoint(settings) as (served, checkpoint, notes):
        env = checkpoint_env(settings, checkpoint, notes)
        capacity = None
        if plan.rate is None:
            capacity = measure_capacity(served, load, plan.capacity_events, env)
            report(f"capacity: {capacity:,.0f} events/s")
        rate = plan.rate or plan.load * (capacity or 0.0)
        if rate <= 0:
            raise RuntimeError("the capacity run measured no throughput")
        events = max(1, round(rate * plan.minutes * 60))
        topics, _ = fresh_topics(settings)
        soak_settings = served.model_copy(update={"topics": topics})
        ensure_topics(settings.kafka.config, topics)
        run = _soak(soak_settings, plan, rate, events, out_dir, report, env)
        _audit(soak_settings, topics, run)
        version = _served_version(served, checkpoint)
    summary_path = out_dir / "pipeline-summary.json"
    result: dict[str, Any] = {
        "plan": asdict(plan),
        "model": model_identity(settings, version),
        "notes": notes,
        "capacity_events_per_s": None if capacity is None else round(capacity, 1),
        "rate": round(rate, 3),
        "events": events,
        **evaluate(plan, rate, run),
        "pipeline_summary": json.loads(summary_path.read_text()) if summary_path.exists() else None,
        "windows": spike_windows(run.samples, plan.warmup_s),
        "trace": trace.summarise(out_dir / TRACE_FILE, run.started_at) if plan.trace else None,
        "samples": [asdict(s) for s in run.samples],
        "json": str(out_dir / "soak.json"),
        "plot": str(out_dir / "soak.png"),
    }
    plot_soak(run.samples, plan, result, Path(result["plot"]))
    Path(result["json"]).write_text(json.dumps(result, indent=2) + "\n")
    return result
