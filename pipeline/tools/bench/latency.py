"""``streamrank bench latency``: end-to-end latency against offered load, in one run.

1. **capacity**: events/s of the pipeline draining a backlog (:func:`drain_backlog`).
2. for each load fraction: a fresh pipeline joins a consumer group on fresh topics; a separate
   producer process (:mod:`pipeline.tools.bench.offered_load`) waits for the group to own the
   input topic, then offers ``fraction * capacity`` events/s for ``seconds``, stamping each
   ``event_time`` as it sends. The pipeline stops once idle; the topics are deleted.

Latency is measured from the output topic, not from the pipeline's own samples: each
Recommendation's ``scored_at`` (when its batch was handed to the producer) minus the
``event_time`` the producer stamped, looked up by ``event_id``. That is the issue's "event_time
-> recommendation produced"; it also counts events without a Recommendation (an error) and
with more than one (``duplicates``), and it does not depend on the pipeline's bookkeeping.
``delivered`` adds the output side: the broker's append time of the Recommendation (the topics
are created with ``message.timestamp.type=LogAppendTime``). The split of each event's latency
(``kafka_in``, ``behind``, ``batching``, ``prepare``, ``forward``, ``rest``) is defined in
:mod:`pipeline.tools.bench.latency_trace`.

Every pipeline is the one ``streamrank run`` builds (:mod:`pipeline.tools.bench.served`; the
report's ``pipeline`` says what it left out). Each load's ``budget`` (and the capacity run's
``capacity_budget``) is the batch policy's account of batches that overran
``batching.latency_budget_ms`` and why (:mod:`pipeline.runtime.budget_account`). Each load also
reports how busy the loop was (``loop_busy_share``: batch processing over the load's wall time),
its batches (``batch_rows``, ``batch_events_mean``), the per-batch fixed cost
(``batch_cost``: the line ``fixed + per_row * rows`` through its batches,
:class:`~pipeline.tools.bench.latency_trace.BatchCosts`) and where the CPU went (``cpu``: per
thread of the pipeline and per process: broker, Redis, producer, busy processes;
:mod:`pipeline.tools.bench.cpu_account`). With ``busy_cores`` the loads run beside that many
busy processes (:mod:`pipeline.tools.bench.busy`; capacity is measured before they start).

With ``[model.module]`` the events are synthesized from its schema and its Redis records from
its layouts (:mod:`pipeline.tools.bench.workload`), and the model served is its version, or the
module freshly initialised (the report's ``model`` says which).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.observability.metrics import Metrics
from pipeline.settings.loading import Settings
from pipeline.tools.bench.busy import BusyProcesses
from pipeline.tools.bench.common import (
    create_topics,
    delete_run_topics,
    fresh_topics,
    record_count,
)
from pipeline.tools.bench.cpu_account import CpuAccount
from pipeline.tools.bench.event_source import OutputFields, event_id_reader
from pipeline.tools.bench.latency_trace import (
    BatchCosts,
    Decomposition,
    StageTrace,
    decompose,
    quantiles_ms,
)
from pipeline.tools.bench.offered_load import OfferedEvents, OfferedLoad, OfferPlan
from pipeline.tools.bench.pipeline import drain_backlog
from pipeline.tools.bench.replay import thread_settings
from pipeline.tools.bench.served import bench_checkpoint, bench_pipeline_of, describe
from pipeline.tools.bench.workload import workload
from pipeline.tools.recommendation_reader import read_messages

LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
DEFAULT_LOADS = (0.25, 0.5, 0.75, 0.9)


def _load_settings(settings: Settings) -> Settings:
    """``settings`` on fresh topics and a fresh consumer group."""
    topics, tag = fresh_topics(settings)
    kafka = settings.kafka.model_copy(update={"group_id": f"bench-latency-{tag}"})
    return settings.model_copy(update={"topics": topics, "kafka": kafka})


def _broker_times(
    settings: Settings,
    topic: str,
    event_id: Callable[[bytes], str],
    scored_at: Callable[[bytes], int] | None = None,
) -> tuple[dict[str, tuple[int, int]], int]:
    """Every record on ``topic`` (created with :data:`LOG_APPEND_TIME`), by event id.

    Args:
        settings: the cluster.
        topic: the topic.
        event_id: a record's value -> its event id.
        scored_at: a record's value -> its scored-at time in ms (``None``: not read, -1).

    Returns:
        event id -> (broker append time ms, scored-at ms or -1), and how many records the
        topic holds (more than the ids when some were written twice).
    """
    total = record_count(settings, topic)
    out: dict[str, tuple[int, int]] = {}
    for message in read_messages(settings, topic, max_records=total, timeout_s=10.0):
        value = message.value() or b""
        _, appended_ms = message.timestamp()
        out[event_id(value)] = (appended_ms, -1 if scored_at is None else scored_at(value))
    return out, total


def _readers(
    settings: Settings,
) -> tuple[Callable[[bytes], str], Callable[[bytes], int], Callable[[bytes], str]]:
    """How to read an output record's event id and scored-at time, and an input event's id
    (the built-in schemas, or the configured ones)."""
    output = OutputFields.of(settings)

    def out_id(value: bytes) -> str:
        return output.event_id(output.codec.decode(value))

    def out_scored(value: bytes) -> int:
        return output.scored_at_ms(output.codec.decode(value))

    return out_id, out_scored, event_id_reader(settings)


def _aligned(
    sent: OfferedEvents, by_id: dict[str, tuple[int, int]], field: int
) -> npt.NDArray[np.int64]:
    """``by_id[event_id][field]`` in sending order; -1 for events not found."""
    return np.array([by_id[e][field] if e in by_id else -1 for e in sent.event_ids], dtype=np.int64)


@dataclass
class LoadRun:
    """What one offered load left behind (arrays in sending order; -1: no record found).

    Attributes:
        fraction: of capacity offered.
        rate: events/s offered.
        sent: what the producer sent.
        scored_at_ms: each event's Recommendation ``scored_at``.
        delivered_ms: broker append time of each Recommendation.
        appended_in_ms: broker append time of each event.
        trace: the run's stage observations.
        budget: the batch policy's account of batches over ``batching.latency_budget_ms``
            (:mod:`pipeline.runtime.budget_account`).
        costs: each batch's rows and processing time, as the batch policy saw them.
        cpu: the CPU account of the run (:meth:`CpuAccount.result`).
        duplicates: Recommendations beyond one per event.
    """

    fraction: float
    rate: float
    sent: OfferedEvents
    scored_at_ms: npt.NDArray[np.int64]
    delivered_ms: npt.NDArray[np.int64]
    appended_in_ms: npt.NDArray[np.int64]
    trace: StageTrace
    budget: dict[str, Any]
    costs: BatchCosts = field(default_factory=BatchCosts)
    cpu: dict[str, Any] = field(default_factory=dict)
    duplicates: int = 0

    @property
    def found(self) -> npt.NDArray[np.bool_]:
        """Events that got a Recommendation."""
        return self.scored_at_ms >= 0

    def decomposition(self) -> Decomposition:
        """The latency split of the events that got a Recommendation."""
        found = self.found
        return decompose(
            self.trace,
            self.sent.event_time_ms[found],
            self.scored_at_ms[found],
            self.appended_in_ms[found],
        )

    def summary(self, warmup_s: float = 0.0) -> dict[str, Any]:
        """This load's entry of the report: latency quantiles (ms), its split, batch sizes and
        the producer's pacing.

        Args:
            warmup_s: events sent in the first ``warmup_s`` seconds are left out of the latency
                figures (their quantiles are ``warmup_latency_ms``): the steady state, not the
                first fetches after the group join. Batch figures cover the whole run.
        """
        found, sent = self.found, self.sent
        parts = self.decomposition()
        sent_at = sent.event_time_ms[found] - sent.event_time_ms.min()
        steady = sent_at >= warmup_s * 1000
        e2e = parts.e2e[steady]
        tail = steady & (parts.e2e >= np.quantile(e2e, 0.99)) if len(e2e) else steady
        _, rows = self.trace.batch_rows.arrays()
        _, forward_s = self.trace.stages["forward"].arrays()
        delivered = (self.delivered_ms - sent.event_time_ms)[found][steady].astype(np.float64)
        window = (sent.event_time_ms.min() / 1000, self.scored_at_ms[found].max() / 1000)
        return {
            "load": self.fraction,
            "offered_events_per_s": round(self.rate, 1),
            "sent_events_per_s": round(sent.achieved_rate, 1),
            "producer_max_late_ms": round(sent.max_late_ms, 1),
            "events": sent.sent,
            "missing": int((~found).sum()),
            "duplicates": self.duplicates,
            "measured_events": int(steady.sum()),
            "latency_ms": quantiles_ms(e2e),
            "delivered_ms": quantiles_ms(delivered),
            "warmup_latency_ms": quantiles_ms(parts.e2e[~steady]),
            "share": parts.shares(steady),
            "share_slowest_1pct": parts.shares(tail),
            "mean_ms": parts.means_ms(steady),
            "mean_ms_slowest_1pct": parts.means_ms(tail),
            "batches": len(rows),
            "batch_rows": quantiles_ms(rows),
            "batch_events_mean": round(len(parts.e2e) / max(1, len(rows)), 1),
            "forward_ms": quantiles_ms(forward_s * 1000),
            "loop_busy_share": self.costs.busy_share(*window),
            "batch_cost": self.costs.line(),
            "budget": self.budget,
            "cpu": self.cpu,
        }


def run_load(
    settings: Settings,
    checkpoint: Path,
    fraction: float,
    rate: float,
    seconds: float,
    *,
    seed: int = 0,
    idle_s: float = 5.0,
    busy: dict[str, int] | None = None,
) -> LoadRun:
    """Offer ``rate`` events/s for ``seconds`` to a fresh pipeline on fresh topics.

    Args:
        settings: the stack and the pipeline's configuration (topics and group are replaced).
        checkpoint: the model served (:func:`~pipeline.tools.bench.served.bench_checkpoint`).
        fraction: of capacity (reported only).
        rate: events per second offered.
        seconds: how long.
        seed: the producer's sampling seed.
        idle_s: the pipeline stops after this long without input (after the last event).
        busy: busy processes running beside it (name -> pid), accounted in its CPU.

    Returns:
        The :class:`LoadRun` (:meth:`LoadRun.summary` is the report's entry).

    Raises:
        RuntimeError: the producer failed, or an event got no Recommendation.

    Example::

        run_load(settings, checkpoint, 0.5, 700.0, 20.0).summary()["latency_ms"]["p99"]
    """
    run = _load_settings(settings)
    create_topics(run, LOG_APPEND_TIME)
    offer = OfferedLoad.start(OfferPlan(run, rate, seconds, seed=seed))
    try:
        metrics = Metrics()
        trace = StageTrace(metrics)
        pipeline = bench_pipeline_of(run, checkpoint, metrics)
        costs = BatchCosts.tap(pipeline.policy)
        offer.wait_ready(300)
        with CpuAccount.of_stack(run, producer=offer.pid, **(busy or {})) as account:
            pipeline.run(exit_when_idle_s=idle_s)
        sent = offer.result(60 + seconds)
        out_id, out_scored, in_id = _readers(run)
        out, out_records = _broker_times(run, run.topics.output, out_id, out_scored)
        inp, _ = _broker_times(run, run.topics.input, in_id)
    finally:
        offer.close()
        delete_run_topics(run)
    result = LoadRun(
        fraction,
        rate,
        sent,
        scored_at_ms=_aligned(sent, out, 1),
        delivered_ms=_aligned(sent, out, 0),
        appended_in_ms=_aligned(sent, inp, 0),
        trace=trace,
        budget=pipeline.policy.budget.as_dict(),
        costs=costs,
        cpu=account.result(),
        duplicates=out_records - len(out),
    )
    missing = int((~result.found).sum())
    if missing:
        raise RuntimeError(f"{missing} of {sent.sent} events got no Recommendation")
    return result


def bench_latency(
    settings: Settings,
    *,
    loads: Sequence[float] = DEFAULT_LOADS,
    seconds: float = 20.0,
    capacity_events: int = 10_000,
    warmup_events: int = 200,
    warmup_s: float = 1.0,
    idle_s: float = 5.0,
    busy_cores: int = 0,
    report: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Capacity, then latency at each load fraction (see the module docstring).

    Seeds the features into Redis first (:func:`~pipeline.tools.bench.workload.workload`).

    Args:
        settings: the stack, the model and the pipeline's configuration.
        loads: fractions of capacity to offer, in this order.
        seconds: how long each load is offered.
        capacity_events: the backlog drained to measure capacity.
        warmup_events: a backlog drained first and not measured: whatever the first batches
            of a process compile or load (numba kernels) is not counted as capacity.
        warmup_s: at each load, events sent in the first ``warmup_s`` seconds after the group
            join are left out of the latency figures (reported apart, ``warmup_latency_ms``).
        idle_s: a load's pipeline stops after this long without input.
        busy_cores: busy processes running beside the loads (not beside the capacity run):
            a shared host (:class:`~pipeline.tools.bench.busy.BusyProcesses`).
        report: called with one line of progress per measurement.

    Returns:
        ``capacity_events_per_s``, the configuration measured, and ``loads``: one entry per
        fraction (:meth:`LoadRun.summary`; none when ``loads`` is empty).

    Example::

        bench_latency(settings, loads=[0.5], seconds=20)["loads"][0]["latency_ms"]["p99"]
    """
    load = workload(settings)
    batching = settings.batching
    with bench_checkpoint(settings) as (settings, checkpoint, notes):
        if warmup_events:
            drain_backlog(settings, checkpoint, load, warmup_events, batching.max_batch_rows)
        drained, pipeline = drain_backlog(
            settings, checkpoint, load, capacity_events, batching.max_batch_rows
        )
        capacity = drained.events_per_s
        report(f"capacity: {capacity:,.0f} events/s draining {capacity_events:,} events")
        entries = []
        with BusyProcesses(busy_cores if loads else 0) as busy:
            for i, fraction in enumerate(loads):
                rate = capacity * fraction
                run = run_load(
                    settings, checkpoint, fraction, rate, seconds, seed=i, idle_s=idle_s,
                    busy=busy.pids,
                )  # fmt: skip
                entries.append(run.summary(warmup_s))
                report(_load_line(entries[-1]))
    cost = pipeline.policy.cost
    described = describe(pipeline, notes)
    return {
        "capacity_events_per_s": round(capacity, 1),
        "capacity_events": capacity_events,
        "capacity_budget": pipeline.policy.budget.as_dict(),
        "capacity_batches": {
            "batches": drained.batches,
            "rows_mean": round(drained.rows_scored / max(1, drained.batches), 1),
            "fixed_ms_estimate": round(cost.fixed_s * 1000, 2),
            "per_row_us_estimate": round(cost.per_row_s * 1e6, 2),
        },
        "seconds": seconds,
        "model_version": pipeline.scorer.model_version,
        "model": described["model"],
        "pipeline": described,
        "max_batch_rows": batching.max_batch_rows,
        "max_delay_ms": batching.max_delay_ms,
        "latency_budget_ms": batching.latency_budget_ms,
        "warmup_s": warmup_s,
        "busy_cores": busy_cores,
        "threads": thread_settings(),
        "loads": entries,
    }


def _load_line(entry: dict[str, Any]) -> str:
    """One line of progress for a load's entry."""
    lat, share, budget = entry["latency_ms"], entry["share"], entry["budget"]
    cost, busy = entry["batch_cost"], entry["loop_busy_share"]
    return (
        f"load {entry['load']:g} ({entry['offered_events_per_s']:,.0f} events/s): "
        f"p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms; "
        f"loop busy {busy['mean']:.0%} (max {busy['max_1s']:.0%} in a second); "
        f"{entry['batch_events_mean']:g} events, {entry['batch_rows']['mean']:.0f} rows/batch, "
        f"fixed cost {cost['fixed_ms']} ms + {cost['per_row_us']} us/row; "
        f"waiting behind earlier batches {share['behind']:.0%}, batching {share['batching']:.0%}, "
        f"forward {share['forward']:.0%}; over the {budget['budget_ms']:g} ms budget: "
        f"{budget['over_budget']} of {budget['batches']} batches {budget['over_budget_causes']}"
    )
