"""What a soak checks: its plan (how long, how hard, the pass marks), what it observed, and the
verdict (:func:`evaluate`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.tools.bench.soak.sampler import Sample
from pipeline.tools.bench.soak.trend import rss_trend


@dataclass(frozen=True)
class SoakPlan:
    """How long, how hard, how often, and the pass marks of a soak."""

    minutes: float = 10.0
    load: float = 0.5
    """Fraction of the measured capacity to offer."""
    rate: float | None = None
    """Events per second to offer; ``None``: ``load`` x the measured capacity."""
    capacity_events: int = 20_000
    sample_s: float = 30.0
    warmup_s: float = 60.0
    """Samples before this are not checked (model, caches and allocator warming up)."""
    max_growth_24h: float = 0.10
    """Bound on RSS growth projected over 24 h by the slope after warm-up (a fraction)."""
    max_lag_s: float = 10.0
    """Lag bound after warm-up, in seconds of input at the offered rate."""
    drain_s: float = 120.0
    trace: bool = False
    """Run the pipeline under :mod:`.trace` (GC pauses, allocator, RSS every second)."""


@dataclass
class SoakRun:
    """What the soak observed, for :func:`evaluate`."""

    samples: list[Sample] = field(default_factory=list)
    missing: int = 0
    duplicates: int = 0
    events_on_input: int = 0
    pipeline_exit: int | None = None
    producer_exit: int | None = None
    lag_after_stop: int | None = None
    started_at: float = 0.0
    """``time.monotonic()`` when the producer started (``t_s = 0``)."""


def evaluate(plan: SoakPlan, rate: float, run: SoakRun) -> dict[str, Any]:
    """The soak's figures and pass/fail checks.

    Args:
        plan: the pass marks.
        rate: events/s offered.
        run: the samples and the audit.

    Returns:
        ``rss`` (:class:`~.trend.RssTrend`: MiB per hour, projected 24 h growth, shape,
        the fits), ``rss_base_bytes`` / ``rss_end_bytes`` / ``rss_growth`` (first and last
        sample after warm-up, reported only), ``max_lag_after_warmup``, ``lag_bound``,
        ``idle_lag``, ``lag_after_stop``, ``p99_ms_max_after_warmup``, ``checks`` (name ->
        bool) and ``passed``.

    Example::

        evaluate(SoakPlan(warmup_s=60), 500.0, run)["checks"]["rss_slope"]
    """
    loaded = [s for s in run.samples if s.phase == "load" and s.t_s >= plan.warmup_s]
    base = loaded[0].rss_bytes if loaded else None
    end = loaded[-1].rss_bytes if loaded else None
    growth = (end - base) / base if base and end is not None else None
    trend = rss_trend([s.t_s for s in loaded], [s.rss_bytes for s in loaded], plan.max_growth_24h)
    lag_bound = plan.max_lag_s * rate
    max_lag = max((s.lag for s in loaded), default=None)
    p99s = [s.p99_ms for s in loaded if s.p99_ms is not None]
    checks = {
        "rss_slope": trend.passed,
        "lag_bounded": max_lag is not None and max_lag <= lag_bound,
        "drained": run.lag_after_stop == 0,
        "nothing_lost": run.events_on_input > 0 and run.missing == 0,
        "clean_exit": run.pipeline_exit == 0 and run.producer_exit == 0,
    }
    return {
        "samples_after_warmup": len(loaded),
        "rss": trend.as_dict(),
        "rss_base_bytes": base,
        "rss_end_bytes": end,
        "rss_growth": None if growth is None else round(growth, 4),
        "max_lag_after_warmup": max_lag,
        "lag_bound": round(lag_bound, 1),
        "idle_lag": run.samples[-1].lag if run.samples else None,
        "lag_after_stop": run.lag_after_stop,
        "p99_ms_max_after_warmup": max(p99s) if p99s else None,
        "events_on_input": run.events_on_input,
        "missing": run.missing,
        "duplicates": run.duplicates,
        "pipeline_exit": run.pipeline_exit,
        "producer_exit": run.producer_exit,
        "checks": checks,
        "passed": all(checks.values()),
    }
