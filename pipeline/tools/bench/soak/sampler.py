"""The soak's samples of a running pipeline: RSS, lag, the window's p99, and the CPU each process
of the stack used, so that a window whose p99 jumped can be set against what was busy in it.

Example::

    sampler = Sampler(settings, group, pipeline.pid, port, first_scrape(pipeline, port))
    sampler.others["producer"] = producer.pid
    sample = sampler.take("load")
    spike_windows(samples, warmup_s=60)
"""

from __future__ import annotations

import itertools
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.settings.loading import Settings
from pipeline.tools.bench.cpu_account import process_cpu_s, stack_pids, thread_cpu_s
from pipeline.tools.bench.soak.probe import (
    MetricsScrape,
    consumer_lag,
    rss_bytes,
    window_max_bound,
    window_quantile,
)

__all__ = ["Sample", "Sampler", "first_scrape", "sample_until", "spike_windows"]

START_TIMEOUT_S = 300.0
"""How long the pipeline may take to serve metrics (model load, group join)."""

SPIKE = 2.0
"""A window whose p99 is this many times the run's median p99 is a spike."""


@dataclass(frozen=True)
class Sample:
    """One sample: seconds since the producer started, and what was measured.

    Attributes:
        cpu_s: CPU seconds used so far by the pipeline's main thread (``loop``), its other
            threads (``pipeline_threads``: librdkafka, torch's workers...), and by the broker,
            Redis and the producer when found (cumulative: windows are differences).
    """

    t_s: float
    phase: str
    """``load`` while the producer runs, ``drain`` after."""
    rss_bytes: int
    lag: int
    p99_ms: float | None
    recommendations: float
    cpu_s: dict[str, float] = field(default_factory=dict)
    batch_rows_max: float | None = None
    """The largest batch of the window (the upper bound of its rows bucket)."""
    loop_preempted: int = 0
    """Times the pipeline's main thread was descheduled against its will so far
    (``nonvoluntary_ctxt_switches``): other work took its core."""


def first_scrape(pipeline: subprocess.Popen[bytes], port: int) -> MetricsScrape:
    """The pipeline's first metrics, once it serves them.

    Raises:
        RuntimeError: it exited, or served none within :data:`START_TIMEOUT_S`.
    """
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if pipeline.poll() is not None:
            raise RuntimeError(f"the pipeline exited with {pipeline.returncode} at start-up")
        try:
            return MetricsScrape.fetch(port)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no metrics after {START_TIMEOUT_S:.0f}s") from None
            time.sleep(0.5)


class Sampler:
    """Takes :class:`Sample` s of one running pipeline.

    Attributes:
        others: processes whose CPU each sample reads (the local broker and Redis; add the
            producer once started).
        started: ``time.monotonic()`` of ``t_s = 0``.
    """

    def __init__(
        self, settings: Settings, group_id: str, pid: int, port: int, first: MetricsScrape
    ) -> None:
        self._settings, self._group, self._pid, self._port = settings, group_id, pid, port
        self._last = first
        self.others: dict[str, int] = stack_pids(settings)
        self.started = time.monotonic()

    def _cpu(self) -> dict[str, float]:
        threads = thread_cpu_s(self._pid)
        loop = threads.pop(self._pid, ("", 0.0))[1]  # the main thread's id is the pid
        cpu = {"loop": loop, "pipeline_threads": sum(c for _, c in threads.values())}
        for name, pid in self.others.items():
            try:
                cpu[name] = process_cpu_s(pid)
            except ProcessLookupError:
                continue
        return {k: round(v, 2) for k, v in cpu.items()}

    def take(self, phase: str) -> Sample:
        """One sample now.

        Raises:
            ProcessLookupError: the pipeline is gone.
        """
        try:
            scrape = MetricsScrape.fetch(self._port)
        except OSError:
            scrape = self._last  # a missed scrape: this window folds into the next
        p99 = window_quantile(0.99, self._last, scrape)
        rows = window_max_bound(self._last, scrape)
        self._last = scrape
        return Sample(
            t_s=round(time.monotonic() - self.started, 1),
            phase=phase,
            rss_bytes=rss_bytes(self._pid),
            lag=consumer_lag(self._settings.kafka, self._group, self._settings.topics.input),
            p99_ms=None if p99 is None else round(p99 * 1000, 2),
            recommendations=scrape.recommendations,
            cpu_s=self._cpu(),
            batch_rows_max=rows,
            loop_preempted=_preempted(self._pid),
        )


def _preempted(pid: int) -> int:
    """``nonvoluntary_ctxt_switches`` of the main thread of ``pid`` (0 when unreadable)."""
    try:
        status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("nonvoluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def sample_until(
    sampler: Sampler,
    done: Callable[[Sample | None], bool],
    every_s: float,
    phase: str,
    samples: list[Sample],
    report: Callable[[str], None],
) -> None:
    """Sample every ``every_s`` into ``samples`` until ``done(last sample)`` (checked every
    0.5 s too) or the pipeline is gone."""
    next_at = time.monotonic() + every_s
    last: Sample | None = None
    while not done(last):
        if time.monotonic() < next_at:
            time.sleep(min(0.5, max(0.0, next_at - time.monotonic())))
            continue
        next_at += every_s
        try:
            last = sampler.take(phase)
        except ProcessLookupError:
            return
        samples.append(last)
        report(
            f"{phase} t={last.t_s:.0f}s rss={last.rss_bytes / 2**20:.1f} MiB lag={last.lag} "
            f"p99={last.p99_ms} ms"
        )


def _cores(before: Sample, after: Sample) -> dict[str, float]:
    seconds = max(1e-9, after.t_s - before.t_s)
    return {
        name: round((after.cpu_s[name] - before.cpu_s.get(name, 0.0)) / seconds, 3)
        for name in after.cpu_s
    }


def spike_windows(samples: Sequence[Sample], warmup_s: float) -> dict[str, Any]:
    """The windows after the warm-up whose p99 was :data:`SPIKE` x the median window's, against
    the median window: what each process used (cores) and how RSS moved in them.

    Returns:
        ``median_p99_ms``, ``median_cores``, ``median_loop_preempted`` and ``spikes``: each
        with ``t_s``, ``p99_ms``, ``rss_step_mib`` (RSS change over the window),
        ``batch_rows_max`` (its largest batch), ``loop_preempted`` (times the loop lost its
        core) and ``cores``.
    """
    pairs = [
        (before, after)
        for before, after in itertools.pairwise(samples)
        if after.phase == "load" and after.t_s >= warmup_s and after.p99_ms is not None
    ]
    if not pairs:
        return {
            "median_p99_ms": None,
            "median_cores": {},
            "median_loop_preempted": None,
            "spikes": [],
        }
    median = float(np.median([after.p99_ms for _, after in pairs]))
    cores = [_cores(before, after) for before, after in pairs]
    names = sorted({name for c in cores for name in c})
    spikes = [
        {
            "t_s": after.t_s,
            "p99_ms": after.p99_ms,
            "rss_step_mib": round((after.rss_bytes - before.rss_bytes) / 2**20, 1),
            "batch_rows_max": after.batch_rows_max,
            "loop_preempted": after.loop_preempted - before.loop_preempted,
            "cores": window,
        }
        for (before, after), window in zip(pairs, cores, strict=True)
        if after.p99_ms is not None and after.p99_ms >= SPIKE * median
    ]
    preempted = [after.loop_preempted - before.loop_preempted for before, after in pairs]
    return {
        "median_p99_ms": round(median, 2),
        "median_cores": {
            n: round(float(np.median([c.get(n, 0.0) for c in cores])), 3) for n in names
        },
        "median_loop_preempted": float(np.median(preempted)),
        "spikes": spikes,
    }
