"""``streamrank bench overhead``: the CPU the pipeline spends around the model, per event.

One run, on fresh topics holding the same N pre-produced events:

a. **passthrough**: a bare consumer reads the N raw messages and a bare producer writes N
   values the size of a Recommendation (no decode, no encode): what Kafka alone costs.
b. **pipeline**: the pipeline ``streamrank run`` builds (:mod:`pipeline.tools.bench.served`:
   retrieval index, metrics and all) scores the N events, serving a tiny untrained ranker of
   the checkpoint's spec (embedding dim 8, one small MLP layer each side, 1 torch thread), so
   the forward is negligible (:data:`TINY_MODEL`; the report's ``pipeline`` lists what is left
   out). With ``[model.module]`` the configured path is measured instead: the module itself,
   untrained, as a version of its own (:data:`CONFIGURED_MODEL`), its events synthesized from
   its schema and its Redis records from its layouts (:mod:`pipeline.tools.bench.configured`);
   the forward is not counted as non-model CPU either way.
c. **stages**: during (b), process CPU time (``resource.getrusage``, so librdkafka's threads
   count) is charged to the stage running at the time; nested stages are exclusive.
"""

from __future__ import annotations

import contextlib
import functools
import resource
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from pipeline.connectors.avro.reference import RECOMMENDATION_SCHEMA_FILE, RecordCodec
from pipeline.connectors.kafka.clients import make_consumer, make_producer, produce
from pipeline.runtime.loop import ScoringPipeline
from pipeline.settings.loading import Settings
from pipeline.tools.bench.common import BenchTopics, seeded_world
from pipeline.tools.bench.configured import (
    CONFIGURED_MODEL,
    configured_checkpoint,
    produce_configured_events,
)
from pipeline.tools.bench.served import (
    bench_checkpoint,
    bench_pipeline_of,
    describe,
    serving,
    tiny_checkpoint,
)
from pipeline.tools.synthetic_io import produce_events

TINY_MODEL = (
    "the model: an untrained ranker of the checkpoint's spec with embedding dim 8 and one "
    "small layer each side, on 1 torch thread, so that the forward is negligible",
    "model watching: the tiny model is a plain checkpoint",
)
"""What the pipeline run of this benchmark changes, and why."""

STAGES = (
    "consume",
    "decode",
    "enrich",
    "features",
    "forward",
    "topk",
    "encode",
    "produce",
    "commit",
    "loop",
)


def cpu_seconds() -> float:
    """User + system CPU of this process, all threads (librdkafka's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class StageClock:
    """Charges process CPU time to the innermost running stage (``loop`` when none runs).

    Example::

        clock = StageClock()
        clock.wrap(enricher, "enrich", "enrich")
        clock.start(); ...; clock.stop()
        clock.seconds["enrich"]
    """

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    _stack: list[str] = field(default_factory=lambda: ["loop"])
    _mark: float = 0.0

    def _switch(self) -> None:
        now = cpu_seconds()
        self.seconds[self._stack[-1]] += now - self._mark
        self._mark = now

    def start(self) -> None:
        self._mark = cpu_seconds()

    def stop(self) -> None:
        self._switch()

    def wrap(self, obj: object, attr: str, stage: str) -> None:
        """Replace ``obj.attr`` (a method) by one that charges its CPU time to ``stage``."""
        inner: Callable[..., Any] = getattr(obj, attr)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._switch()
            self._stack.append(stage)
            try:
                return inner(*args, **kwargs)
            finally:
                self._switch()
                self._stack.pop()

        setattr(obj, attr, timed)


def _run_settings(settings: Settings, bench_topics: BenchTopics) -> Settings:
    topics, tag = bench_topics.fresh()
    kafka = settings.kafka.model_copy(update={"group_id": f"bench-overhead-{tag}"})
    return settings.model_copy(update={"topics": topics, "kafka": kafka})


def passthrough(settings: Settings, events: int, value_bytes: int) -> tuple[float, float]:
    """Consume ``events`` raw messages and produce as many ``value_bytes`` values.

    Returns:
        ``(events per second, CPU seconds)`` from the first message consumed to the last
        acknowledged.
    """
    consumer = make_consumer(settings.kafka.config)
    producer = make_producer(settings.kafka.config)
    consumer.subscribe([settings.topics.input])
    value = bytes(value_bytes)
    seen = 0
    started = cpu0 = 0.0
    try:
        while seen < events:
            batch = consumer.consume(settings.batching.consume_batch_size, 1.0)
            if batch and not seen:
                started, cpu0 = time.perf_counter(), cpu_seconds()
            for message in batch:
                if message.error():
                    continue
                produce(producer, settings.topics.output, value, key=message.key())
                seen += 1
            producer.poll(0)
        producer.flush(30)
        return seen / (time.perf_counter() - started), cpu_seconds() - cpu0
    finally:
        consumer.close()


def recommendation_size(settings: Settings, items: int = 10) -> int:
    """Bytes of a typical Recommendation value (``items`` scored items, no fallbacks)."""
    codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, settings.topics.output)
    record = {
        "event_id": "0123456789abcdef0123456789abcdef",
        "user_id": 123_456,
        "items": [{"item_id": 50_000 + i, "score": 0.5} for i in range(items)],
        "model_version": "m-1",
        "scored_at": int(time.time() * 1000),
        "fallback_features": [],
    }
    return len(codec.encode(record))


def _instrument(pipeline: ScoringPipeline, clock: StageClock) -> None:
    clock.wrap(pipeline.decoder, "decode", "decode")
    clock.wrap(pipeline.enricher, "enrich", "enrich")
    clock.wrap(pipeline.scorer, "stage", "features")
    clock.wrap(pipeline.scorer, "forward", "forward")
    clock.wrap(pipeline.scorer, "top_k", "topk")
    start = pipeline._start

    def start_timed() -> Any:
        run = start()
        clock.wrap(run.source, "poll", "consume")
        steps = run.processor._steps
        clock.wrap(steps, "prepare", "features")
        clock.wrap(steps._sink, "encode_batch", "encode")
        clock.wrap(steps._sink, "send", "produce")
        clock.wrap(run.dead_letters, "publish", "produce")
        clock.wrap(run.checkpointer, "commit_ready", "commit")
        clock.wrap(run.checkpointer, "flush_and_commit", "commit")
        clock.wrap(run.checkpointer, "flush_and_send", "commit")
        clock.wrap(run.checkpointer, "send_again", "commit")
        return run

    pipeline._start = start_timed  # type: ignore[method-assign]


def pipeline_run(
    settings: Settings, checkpoint: Path, events: int
) -> tuple[float, StageClock, ScoringPipeline]:
    """Score the ``events`` already on ``settings.topics.input`` with the pipeline ``streamrank
    run`` builds, serving ``checkpoint``.

    Returns:
        ``(events per second of busy time, the stage clock, the pipeline)``.
    """
    pipeline = bench_pipeline_of(settings, checkpoint)
    clock = StageClock()
    _instrument(pipeline, clock)
    clock.start()
    summary = pipeline.run(exit_when_idle_s=1.0)
    clock.stop()
    if summary.events_out != events:
        raise RuntimeError(f"overhead run scored {summary.events_out} of {events} events")
    return summary.events_per_s, clock, pipeline


def bench_overhead(
    settings: Settings,
    *,
    events: int,
    report: Callable[[str], None] = print,
    keep_topics: bool = False,
) -> dict[str, Any]:
    """Passthrough vs the whole pipeline with a negligible model (see the module docstring).

    Args:
        settings: the stack (Kafka, Redis, framing, batching).
        events: N, the events produced once and read by both runs.
        report: called with one line of progress per measurement.
        keep_topics: keep the run's topics (default: deleted at the end).

    Returns:
        ``passthrough_eps``, ``pipeline_eps``, ``cpu_us_per_event`` (all stages),
        ``non_model_cpu_us_per_event`` (all but forward), ``stages_us`` (per stage, per event)
        and the passthrough's CPU per event.

    Example::

        bench_overhead(settings, events=20_000)["stages_us"]["decode"]
    """
    configured = settings.model.module is not None
    world = None if configured else seeded_world(settings)
    with contextlib.ExitStack() as stack:
        if configured:  # the module of [model.module], untrained: a version of its own
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sr-")))
            served, notes = configured_checkpoint(settings, scratch), list(CONFIGURED_MODEL)
        else:
            settings, checkpoint, notes = stack.enter_context(bench_checkpoint(settings))
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sr-")))
            served, notes = tiny_checkpoint(checkpoint, scratch), [*notes, *TINY_MODEL]
        topics = stack.enter_context(BenchTopics(settings, keep_topics))
        run = _run_settings(serving(settings, served), topics)
        if world is None:
            produce_configured_events(run, events)
        else:
            produce_events(run, world, events)
        own_group = run.kafka.model_copy(update={"group_id": f"{run.kafka.group_id}-passthrough"})
        pass_eps, pass_cpu = passthrough(
            run.model_copy(update={"kafka": own_group}), events, recommendation_size(run)
        )
        report(f"passthrough: {pass_eps:,.0f} events/s, {pass_cpu / events * 1e6:.1f} us CPU/event")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny forward gains nothing from intra-op threads spinning
        try:
            pipe_eps, clock, pipeline = pipeline_run(run, run.model.checkpoint, events)
        finally:
            torch.set_num_threads(threads)
    stages_us = {k: round(v / events * 1e6, 2) for k, v in clock.seconds.items()}
    total = sum(clock.seconds.values()) / events * 1e6
    non_model = total - stages_us["forward"]
    report(
        f"pipeline: {pipe_eps:,.0f} events/s, {total:.1f} us CPU/event, {non_model:.1f} non-model"
    )
    return {
        "path": "configured" if configured else "built-in",
        "events": events,
        "passthrough_eps": round(pass_eps, 1),
        "passthrough_cpu_us_per_event": round(pass_cpu / events * 1e6, 2),
        "pipeline_eps": round(pipe_eps, 1),
        "cpu_us_per_event": round(total, 2),
        "non_model_cpu_us_per_event": round(non_model, 2),
        "stages_us": stages_us,
        "pipeline": describe(pipeline, notes),
    }
