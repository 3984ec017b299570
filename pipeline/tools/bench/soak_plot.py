"""The soak's PNG: RSS, consumer lag and p99 latency over time, the warm-up shaded, the end of
the load dotted.

Rendered with matplotlib's Agg canvas (no display needed), like :mod:`pipeline.tools.report`.

Example::

    plot_soak(run.samples, plan, result, Path("artifacts/soak/soak.png"))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

if TYPE_CHECKING:
    from pipeline.tools.bench.soak import Sample, SoakPlan


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
    growth = result.get("rss_growth")
    shown_growth = "n/a" if growth is None else f"{growth * 100:+.1f}%"
    rss.plot(minutes, [s.rss_bytes / 2**20 for s in samples], marker="o", color="tab:blue")
    rss.set_ylabel("RSS (MiB)")
    rss.set_title(f"pipeline process RSS (growth after warm-up {shown_growth})")
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
        axes.set_ylim(bottom=0)
    verdict = "passed" if result.get("passed") else "FAILED"
    figure.suptitle(
        f"soak: {result['rate']:,.0f} events/s for {plan.minutes:g} min, {verdict} "
        f"(missing {result['missing']}, duplicates {result['duplicates']})"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path
