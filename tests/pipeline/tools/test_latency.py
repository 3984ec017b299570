"""``bench latency``: the producer's schedule, the latency split, and a smoke run on the stack."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka.admin import AdminClient

from pipeline.observability.metrics import Metrics
from pipeline.runtime.batch_policy import BatchPolicy
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.loading import Settings
from pipeline.tools.bench.busy import BusyProcesses
from pipeline.tools.bench.cpu_account import process_cpu_s
from pipeline.tools.bench.latency import bench_latency
from pipeline.tools.bench.latency_plot import plot_latency
from pipeline.tools.bench.latency_trace import (
    BatchCosts,
    BusyTime,
    StageTrace,
    decompose,
    quantiles_ms,
)
from pipeline.tools.bench.offered_load import OfferPlan, Pacer
from tests.integration.conftest import WORLD, model_settings


class FakeClock:
    """Monotonic time that moves only when slept on (plus any lateness a test injects)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.late = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds + self.late


def test_pacer_releases_the_rate_in_small_bursts_on_schedule() -> None:
    clock = FakeClock()
    pacer = Pacer(rate=1000.0, tick_s=0.002, clock=clock, sleep=clock.sleep)
    pacer.start()
    bursts = [pacer.next_burst() for _ in range(500)]  # one second of ticks
    assert sum(bursts) == 1000
    assert max(bursts) <= 3  # 2 per tick, +1 for float rounding
    assert pacer.max_late_s == pytest.approx(0.0, abs=1e-9)


def test_a_late_pacer_catches_up_and_says_how_late_it_was() -> None:
    clock = FakeClock()
    pacer = Pacer(rate=500.0, tick_s=0.01, clock=clock, sleep=clock.sleep)
    pacer.start()
    assert pacer.next_burst() == 5
    clock.now += 0.1  # the process was descheduled for 100 ms
    assert pacer.next_burst() == 50  # everything due by now, at once
    assert pacer.max_late_s == pytest.approx(0.09)
    total = 55 + sum(pacer.next_burst() for _ in range(10))
    assert total == math.floor(500.0 * (clock.now - 100.0) + 1e-9)


def test_pacer_rejects_a_rate_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="rate"):
        Pacer(rate=0.0)


def test_offer_plan_sends_rate_times_seconds_events() -> None:
    assert OfferPlan(Settings(), rate=333.3, seconds=3.0).events == 1000


def _trace(stages: dict[str, list[tuple[float, float]]], rows: list[float]) -> StageTrace:
    """A trace holding the given (end wall time s, seconds) observations per stage."""
    trace = StageTrace(Metrics())
    for name, observations in stages.items():
        kept = trace.stages[name]
        for end, seconds in observations:
            kept.ends.append(end)
            kept.values.append(seconds)
    trace.batch_rows.values.extend(rows)
    trace.batch_rows.ends.extend([0.0] * len(rows))
    return trace


def test_the_trace_keeps_what_the_pipeline_observes_and_still_exports_it() -> None:
    metrics = Metrics()
    trace = StageTrace(metrics)
    with metrics.stage("forward"):
        pass
    metrics.batch_rows.observe(128)
    assert len(trace.stages["forward"].values) == 1
    assert trace.batch_rows.values == [128]
    count = metrics.registry.get_sample_value(
        "streamrank_stage_duration_seconds_count", {"stage": "forward"}
    )
    assert count == 1.0


def test_each_event_is_charged_its_own_batchs_stages_and_its_waits() -> None:
    t0 = 1_700_000_000.0
    # Batch 0: enrich 8-10 ms, features 10-13, forward 13-33, produce 34-36 (ms after t0).
    # Batch 1: enrich 46-50, features 50-51, forward 51-91, produce 91-93.
    trace = _trace(
        {
            "enrich": [(t0 + 0.010, 0.002), (t0 + 0.050, 0.004)],
            "features": [(t0 + 0.013, 0.003), (t0 + 0.051, 0.001)],
            "forward": [(t0 + 0.033, 0.020), (t0 + 0.091, 0.040)],
            "produce": [(t0 + 0.036, 0.002), (t0 + 0.093, 0.002)],
        },
        rows=[100.0, 300.0],
    )
    ms = int(t0 * 1000)
    event_time = np.array([ms - 20, ms + 30], dtype=np.int64)
    appended = np.array([ms - 15, ms + 31], dtype=np.int64)
    scored_at = np.array([ms + 34, ms + 92], dtype=np.int64)
    parts = decompose(trace, event_time, scored_at, appended)
    assert parts.batch.tolist() == [0, 1]
    assert parts.e2e.tolist() == [54.0, 62.0]
    got = {k: pytest.approx(v.tolist(), abs=1e-3) for k, v in parts.components.items()}
    assert got == {
        "kafka_in": [5.0, 1.0],
        # event 0 waited 23 ms for its batch to close (t0+8 ms), the loop idle all along;
        # event 1 waited 15 ms (31 -> 46), 4 of them while batch 0's forward and produce ran.
        "behind": [0.0, 4.0],
        "batching": [23.0, 11.0],
        "prepare": [5.0, 5.0],
        "forward": [20.0, 40.0],
        "rest": [1.0, 1.0],
    }
    assert sum(parts.shares().values()) == pytest.approx(1.0, abs=0.002)
    assert parts.means_ms(parts.e2e >= 60)["forward"] == pytest.approx(40.0)


def test_busy_time_counts_overlapping_stages_once() -> None:
    trace = _trace({"forward": [(10.0, 4.0)], "enrich": [(8.0, 2.0), (12.0, 1.0)]}, rows=[])
    busy = BusyTime(trace)  # union: [6, 10] and [11, 12]
    lo, hi = np.array([0.0, 7.0, 10.5]), np.array([20.0, 9.0, 11.5])
    assert busy.between(lo, hi).tolist() == pytest.approx([5.0, 2.0, 0.5])


def test_batch_costs_keep_what_the_policy_learns_and_fit_the_fixed_cost() -> None:
    policy = BatchPolicy(max_delay_ms=20, latency_budget_ms=100)
    costs = BatchCosts.tap(policy)
    for rows in (100, 400, 1600, 3200) * 3:
        policy.observe(rows, 0.004 + 12e-6 * rows, now=1.0)
    assert costs.rows[:4] == [100, 400, 1600, 3200]
    line = costs.line()
    assert (line["batches"], line["fixed_ms"], line["per_row_us"]) == (12, 4.0, 12.0)
    assert policy.load.busy_share(1.0) > 0  # the policy was still told


def test_the_loop_busy_share_is_processing_over_wall_time_second_by_second() -> None:
    costs = BatchCosts()
    # [100.1, 100.3], [100.7, 101.2] (straddles a second), [101.3, 101.9]:
    # second 0 busy 0.2 + 0.3 s, second 1 0.2 + 0.6 s, second 2 none
    for end, seconds in ((100.3, 0.2), (101.2, 0.5), (101.9, 0.6)):
        costs.rows.append(100)
        costs.seconds.append(seconds)
        costs.ends.append(end)
    busy = costs.busy_share(100.0, 103.0)
    assert busy["mean"] == pytest.approx(1.3 / 3, abs=1e-3)
    assert busy["max_1s"] == pytest.approx(0.8)
    # a window ending within a second: the last, shorter second counts over its own length
    short = costs.busy_share(100.5, 101.9)  # [100.5, 101.5]: 0.5 + 0.2; [101.5, 101.9]: 0.4
    assert short["max_1s"] == pytest.approx(1.0) and short["mean"] <= short["max_1s"]
    assert math.isnan(costs.busy_share(5.0, 5.0)["mean"])
    assert math.isnan(BatchCosts().line()["fixed_ms"])  # no batches: no line


def test_busy_processes_spin_and_end_by_pid() -> None:
    with BusyProcesses(1) as busy:
        (pid,) = busy.pids.values()
        cpu = process_cpu_s(pid)
        deadline = time.monotonic() + 30  # a loaded host may give it little of a core
        while process_cpu_s(pid) < cpu + 0.2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert process_cpu_s(pid) >= cpu + 0.2  # it spins
    with pytest.raises(ProcessLookupError):
        process_cpu_s(pid)  # ended and reaped
    assert busy.pids == {}
    with BusyProcesses(0) as none:
        assert none.pids == {}


def test_quantiles_of_nothing_are_nan() -> None:
    assert all(math.isnan(v) for v in quantiles_ms(np.array([])).values())
    q = quantiles_ms(np.arange(1, 101, dtype=np.float64))
    assert q["p50"] <= q["p95"] <= q["p99"] <= q["max"] == 100.0


def test_the_plot_draws_every_run(tmp_path: Path) -> None:
    def report(scale: float) -> dict:
        latency = {"p50": scale, "p99": 2 * scale}
        loads = [
            {"load": f, "offered_events_per_s": 100 * f, "latency_ms": latency} for f in (0.25, 0.5)
        ]
        return {"capacity_events_per_s": 100.0, "loads": loads}

    path = plot_latency([("after", report(10.0)), ("before", report(50.0))], tmp_path / "l.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smoke_run_on_the_stack_reports_every_load_and_deletes_its_topics(
    settings_factory: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_factory(
        model=model_settings(tmp_path / "no-checkpoint"),  # untrained, small
        synthetic=WORLD,
        batching=BatchingSettings(max_batch_rows=256, max_delay_ms=20),
    )
    admin = AdminClient(settings.kafka.config.admin)
    topics_before = set(admin.list_topics(timeout=10).topics)
    lines: list[str] = []
    report = bench_latency(
        settings,
        loads=(0.2, 0.4),
        seconds=1.5,
        warmup_s=0.5,
        capacity_events=150,
        warmup_events=20,
        idle_s=2.0,
        busy_cores=1,
        report=lines.append,
    )
    assert report["capacity_events_per_s"] > 0
    assert report["busy_cores"] == 1 and "torch_threads" in report["threads"]
    assert [entry["load"] for entry in report["loads"]] == [0.2, 0.4]
    for entry in report["loads"]:
        rate = report["capacity_events_per_s"] * entry["load"]
        assert entry["offered_events_per_s"] == pytest.approx(rate, abs=0.1)
        # ceil(rate x seconds) events, at the rate before the report rounded it to 0.1 events/s
        offered = entry["offered_events_per_s"]
        fewest, most = (max(1, math.ceil((offered + d) * 1.5)) for d in (-0.05, 0.05))
        assert fewest <= entry["events"] <= most
        assert entry["missing"] == entry["duplicates"] == 0
        assert 0 < entry["measured_events"] < entry["events"]  # the first 0.5 s left out
        latency = entry["latency_ms"]
        assert 0 <= latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
        assert entry["delivered_ms"]["p50"] >= latency["p50"]
        assert sum(entry["share"].values()) == pytest.approx(1.0, abs=0.01)
        assert 0 < entry["batches"] <= entry["events"]
        assert entry["batch_rows"]["max"] <= 256
        assert 0 < entry["loop_busy_share"]["mean"] <= entry["loop_busy_share"]["max_1s"] <= 1.0
        assert entry["batch_cost"]["batches"] == entry["batches"]
        assert {"loop", "broker", "redis", "producer", "busy-1"} <= set(entry["cpu"]["cores"])
        # It spun beside the load and its CPU is measured per load. How much of a core it gets
        # is the host's to say (0.27 with three test workers on two cores); that it spins is
        # test_busy_processes_spin_and_end_by_pid's.
        assert entry["cpu"]["cores"]["busy-1"] > 0
    assert len(lines) == 3  # capacity, then one line per load
    assert _new_topics(admin, topics_before) == set()


def _new_topics(admin: AdminClient, before: set[str], attempts: int = 50) -> set[str]:
    """Topics that were not there before (internal ones aside), once deletions have reached the
    metadata."""
    for _ in range(attempts):
        topics = admin.list_topics(timeout=10).topics
        new = {t for t in topics if not t.startswith("__")} - before
        if not new:
            return new
        time.sleep(0.2)
    return new
