"""The PNG of ``streamrank bench latency --plot``: p50 and p99 against offered load.

Several runs (e.g. before and after a change) can share one plot; each is a labelled pair of
lines. Rendered with matplotlib's Agg canvas: no display needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def plot_latency(runs: Sequence[tuple[str, dict[str, Any]]], path: Path) -> Path:
    """Write p50 (solid) and p99 (dashed) end-to-end latency vs offered events/s (log scale).

    Args:
        runs: ``(label, report)`` per run; a report is what
            :func:`~pipeline.tools.bench.latency.bench_latency` returns.
        path: the PNG to write.

    Returns:
        ``path``.

    Example::

        plot_latency([("after", report), ("before", json.loads(old.read_text()))], Path("l.png"))
    """
    fig = Figure(figsize=(7.5, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for k, (label, report) in enumerate(runs):
        color = f"C{k}"
        loads = report["loads"]
        rates = [entry["offered_events_per_s"] for entry in loads]
        capacity = report["capacity_events_per_s"]
        for quantile, style in (("p50", "-"), ("p99", "--")):
            values = [entry["latency_ms"][quantile] for entry in loads]
            ax.plot(
                rates,
                values,
                style,
                marker="o",
                color=color,
                label=f"{label} {quantile} (capacity {capacity:,.0f}/s)",
            )
        for entry, rate in zip(loads, rates, strict=True):
            ax.annotate(
                f"{entry['load']:g}",
                (rate, entry["latency_ms"]["p99"]),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=7,
                color=color,
            )
    ax.set_xlabel("offered load (events/s); labels: fraction of capacity")
    ax.set_ylabel("event_time -> recommendation produced (ms, log scale)")
    ax.set_title("End-to-end latency vs offered load")
    # Log scale: tens of ms at low load and seconds past capacity are both readable.
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    return path
