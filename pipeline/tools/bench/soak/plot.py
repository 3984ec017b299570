"""The soak's PNG: RSS (on an axis that shows its climb, with the fitted lines of the check),
consumer lag and p99 latency over time, the warm-up shaded, the end of the load dotted.

Rendered with matplotlib's Agg canvas (no display needed), like :mod:`pipeline.tools.report`.

Example::

    plot_soak(run.samples, plan, result, Path("artifacts/soak/soak.png"))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipeline.tools.bench.soak.trend import MIB, rss_trend

if TYPE_CHECKING:
    from pipeline.tools.bench.soak.plan import SoakPlan
    from pipeline.tools.bench.soak.sampler import Sample


def plot_soak(
    samples: Sequence[Sample], plan: SoakPlan, result: dict[str, Any], path: Path
) -> Path:
    """Draw three panels over minutes since the producer started and write ``path``.

    Args:
        samples: the soak's samples (load and drain).
        plan: its warm-up and lag bound.
        result: :func:`pipeline.tools.bench.soak.evaluate`'s figures (for the titles).
        path: the PNG to write.

    Returns:
        ``path``.
    """
    minutes = [s.t_s / 60 for s in samples]
    figure = Figure(figsize=(9, 9), dpi=100)
    FigureCanvasAgg(figure)
    rss, lag, p99 = figure.subplots(3, 1, sharex=True)
    rss.plot(minutes, [s.rss_bytes / MIB for s in samples], marker="o", color="tab:blue")
    _fitted_lines(rss, samples, plan)
    rss.set_ylabel("RSS (MiB)")
    trend = result.get("rss") or {}
    slope = trend.get("mib_per_hour")
    rss.set_title(
        "pipeline process RSS (axis not from 0): n/a"
        if slope is None
        else f"pipeline process RSS (axis not from 0): {slope:+.1f} MiB/h after warm-up, "
        f"{trend['growth_24h']:+.1%} in 24 h projected ({trend['shape']})"
    )
    lag.plot(minutes, [s.lag for s in samples], marker="o", color="tab:orange")
    lag.axhline(result["lag_bound"], color="tab:red", linestyle="--", label="bound")
    lag.set_ylabel("messages")
    lag.set_title("consumer lag (uncommitted input)")
    lag.legend(loc="upper right")
    timed = [(m, s.p99_ms) for m, s in zip(minutes, samples, strict=True) if s.p99_ms is not None]
    p99.plot([m for m, _ in timed], [v for _, v in timed], marker="o", color="tab:green")
    p99.set_ylabel("ms")
    p99.set_title("end-to-end latency p99 per sample window")
    p99.set_xlabel("minutes since the producer started")
    loaded = [m for m, s in zip(minutes, samples, strict=True) if s.phase == "load"]
    for axes in (rss, lag, p99):
        axes.axvspan(0, plan.warmup_s / 60, color="0.9", label="_warm-up")
        if loaded:  # the producer's end: the drain follows
            axes.axvline(loaded[-1], color="0.5", linestyle=":", label="_load end")
        axes.grid(True, color="0.85")
    for axes in (lag, p99):
        axes.set_ylim(bottom=0)
    verdict = "passed" if result.get("passed") else "FAILED"
    rss.legend(loc="upper left")
    figure.suptitle(
        f"soak: {result['rate']:,.0f} events/s for {plan.minutes:g} min, {verdict} "
        f"(missing {result['missing']}, duplicates {result['duplicates']})"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path


def _fitted_lines(axes: Axes, samples: Sequence[Sample], plan: SoakPlan) -> None:
    """The fitted lines of the RSS check (:mod:`.soak_trend`): over the whole span after
    warm-up, and its later half (the one checked)."""
    loaded = [s for s in samples if s.phase == "load" and s.t_s >= plan.warmup_s]
    trend = rss_trend([s.t_s for s in loaded], [s.rss_bytes for s in loaded], plan.max_growth_24h)
    for fit, style, label in (
        (trend.whole, "--", "fit after warm-up"),
        (trend.later, "-", "later half (checked)"),
    ):
        if fit is None:
            continue
        ends = [fit.start_s, fit.end_s]
        axes.plot(
            [t / 60 for t in ends],
            [fit.at(t) / MIB for t in ends],
            linestyle=style,
            color="tab:red",
            label=f"{label}: {fit.mib_per_hour:+.1f} MiB/h",
        )
