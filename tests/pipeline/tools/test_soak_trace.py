"""The soak's diagnostics: windows whose p99 jumped set against the median window, and the
tracer that runs the pipeline's process (GC pauses, allocator, RSS steps)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipeline.tools.bench.soak.sampler import Sample, spike_windows
from pipeline.tools.bench.soak.trace import summarise
from tests.conftest import REPO_ROOT

MIB = 2**20


def _sample(
    t_s: float, p99_ms: float, rss_mib: float, loop_s: float, broker_s: float, preempted: int = 0
) -> Sample:
    return Sample(t_s, "load", int(rss_mib * MIB), 0, p99_ms, 0.0,
                  {"loop": loop_s, "broker": broker_s}, 512.0, preempted)  # fmt: skip


def test_a_spike_window_is_set_against_the_median_window() -> None:
    samples = [
        _sample(0, 50, 1000, 0, 0),  # warm-up
        _sample(10, 50, 1000, 5, 2),
        _sample(20, 55, 1000, 10, 4),
        _sample(30, 160, 1012, 15, 12, 40),  # p99 x3, the broker busy, RSS +12 MiB, preempted
        _sample(40, 50, 1012, 20, 14, 40),
    ]
    result = spike_windows(samples, warmup_s=10)
    assert result["median_p99_ms"] == 52.5
    assert result["median_cores"] == {"broker": 0.2, "loop": 0.5}
    assert result["median_loop_preempted"] == 0
    assert result["spikes"] == [
        {"t_s": 30, "p99_ms": 160, "rss_step_mib": 12.0, "batch_rows_max": 512.0,
         "loop_preempted": 40, "cores": {"loop": 0.5, "broker": 0.8}}
    ]  # fmt: skip
    assert spike_windows(samples[:1], warmup_s=0)["spikes"] == []


def test_the_trace_summary_lists_slow_collections_and_rss_steps(tmp_path: Path) -> None:
    records = [
        {"t": 100.0, "rssanon_mib": 700, "heap_mib": 300, "mmap_mib": 190, "in_use_mib": 200,
         "py_blocks": 10, "gc_counts": [0, 0, 0]},
        {"t": 101.0, "rssanon_mib": 702, "heap_mib": 300, "mmap_mib": 190, "in_use_mib": 201,
         "py_blocks": 12, "gc_counts": [0, 0, 0]},
        {"t": 101.5, "gc": 2, "pause_ms": 180.0, "collected": 3, "rssanon_mib": 702},
        {"t": 101.6, "gc": 1, "pause_ms": 2.0, "collected": 0, "rssanon_mib": 702},
        {"t": 102.0, "rssanon_mib": 713, "heap_mib": 311, "mmap_mib": 190, "in_use_mib": 201,
         "py_blocks": 12, "gc_counts": [0, 0, 0]},
    ]  # fmt: skip
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = summarise(trace, started_at=90.0)
    assert summary["gc"] == {
        "2": {"collections": 1, "max_pause_ms": 180.0},
        "1": {"collections": 1, "max_pause_ms": 2.0},
    }
    assert summary["slow_gc"] == [{"t_s": 11.5, "generation": 2, "pause_ms": 180.0}]
    # +11 MiB in one second: the heap grew while the bytes in use did not
    assert summary["rss_steps"] == [
        {"t_s": 12.0, "anon_mib": 11, "heap_mib": 11, "mmap_mib": 0, "in_use_mib": 0,
         "py_blocks": 0}
    ]  # fmt: skip


def test_the_tracer_runs_a_streamrank_command_in_its_process(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.tools.bench.soak.trace", str(trace), "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip()  # streamrank's version
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    samples = [r for r in records if "py_blocks" in r]  # the others: collections during import
    assert samples, records
    assert {"rssanon_mib", "rssfile_mib", "gc_counts", "heap_mib"} <= set(samples[0])


def test_the_largest_batch_of_a_window_is_read_from_the_histogram() -> None:
    from pipeline.tools.bench.soak.probe import MetricsScrape, window_max_bound

    earlier = MetricsScrape(batch_rows_buckets=((256.0, 5.0), (1024.0, 9.0), (float("inf"), 9.0)))
    later = MetricsScrape(batch_rows_buckets=((256.0, 8.0), (1024.0, 14.0), (float("inf"), 14.0)))
    assert window_max_bound(earlier, later) == 1024.0  # two more batches of 257-1024 rows
    assert window_max_bound(later, later) is None
