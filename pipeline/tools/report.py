"""PNG plots of a run, from the metrics Prometheus stored: throughput, p50/p99 end-to-end
latency, DLQ by reason and batch size over a time range.

Each plot is one range query (``/api/v1/query_range``) per line, over the scrape data of every
rank Prometheus scraped. Rendered with matplotlib's Agg canvas: no display needed.

Example::

    from pipeline.tools.report import parse_duration, write_report
    paths = write_report(Path("report"), "http://127.0.0.1:9090", since_s=parse_duration("30m"))
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True)
class Plot:
    """One PNG: a title, a y-axis label and its lines.

    Attributes:
        name: file name without ``.png``.
        lines: ``(legend, PromQL)``; ``{label}`` in a legend is filled from the series'
            labels, ``{w}`` in the PromQL with the rate window.
    """

    name: str
    title: str
    ylabel: str
    lines: tuple[tuple[str, str], ...]
    skip_zero: bool = False
    """Leave out series that stay at zero (e.g. DLQ reasons that never happened)."""


PLOTS = (
    Plot(
        "throughput",
        "Throughput",
        "per second",
        (
            ("consumed messages", "sum(rate(streamrank_consumed_messages_total[{w}]))"),
            ("recommendations", "sum(rate(streamrank_produced_recommendations_total[{w}]))"),
        ),
    ),
    Plot(
        "latency",
        "End-to-end latency (event_time -> produced)",
        "seconds",
        tuple(
            (
                f"p{percent}",
                f"histogram_quantile({percent / 100}, sum by (le) "
                "(rate(streamrank_end_to_end_latency_seconds_bucket[{w}])))",
            )
            for percent in (50, 99)
        ),
    ),
    Plot(
        "dlq",
        "Dead-lettered messages by reason",
        "per second",
        (("{reason}", "sum by (reason) (rate(streamrank_dead_letter_messages_total[{w}]))"),),
        skip_zero=True,
    ),
    Plot(
        "batch_rows",
        "Rows per batch",
        "rows",
        (
            (
                "mean",
                "sum(rate(streamrank_batch_rows_sum[{w}])) "
                "/ sum(rate(streamrank_batch_rows_count[{w}]))",
            ),
        ),
    ),
)


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus-style duration.

    Args:
        text: ``500ms``, ``90s``, ``30m``, ``2h``, ``1d``.

    Returns:
        The duration in seconds.

    Example::

        >>> parse_duration("30m")
        1800.0
    """
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 30m, 2h)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def query_range(
    prometheus_url: str, expr: str, start: float, end: float, step_s: float
) -> list[tuple[dict[str, str], list[float], list[float]]]:
    """One ``/api/v1/query_range`` call.

    Args:
        prometheus_url: base URL, e.g. ``http://127.0.0.1:9090``.
        expr: PromQL.
        start, end: unix seconds.
        step_s: resolution.

    Returns:
        Per series: its labels, the unix times and the values (NaN where Prometheus says so).
    """
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step_s})
    url = f"{prometheus_url.rstrip('/')}/api/v1/query_range?{params}"
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise RuntimeError(f"prometheus: {expr}: {body.get('error', body)}")
    return [
        (
            series["metric"],
            [float(t) for t, _ in series["values"]],
            [float(v) for _, v in series["values"]],
        )
        for series in body["data"]["result"]
    ]


def _render(
    plot: Plot, prometheus_url: str, start: float, end: float, step_s: float, window: str
) -> Figure:
    figure = Figure(figsize=(9, 4), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    drawn = 0
    for legend, expr in plot.lines:
        for labels, times, values in query_range(
            prometheus_url, expr.replace("{w}", window), start, end, step_s
        ):
            if plot.skip_zero and not np.nan_to_num(values).any():
                continue
            stamps = (np.asarray(times) * 1000).astype("datetime64[ms]")
            axes.plot(stamps, values, label=legend.format_map(_Labels(labels)))
            drawn += 1
    if drawn:
        axes.legend(loc="upper left", fontsize="small")
    else:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
    axes.set_title(plot.title)
    axes.set_ylabel(plot.ylabel)
    axes.set_xlabel("time (UTC)")
    axes.grid(True, alpha=0.3)
    locator = AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    return figure


class _Labels(dict[str, str]):
    """Series labels for ``str.format_map``; a missing label reads as ``-``."""

    def __missing__(self, key: str) -> str:
        return "-"


def write_report(
    out_dir: Path,
    prometheus_url: str = "http://127.0.0.1:9090",
    *,
    start: float | None = None,
    end: float | None = None,
    since_s: float = 3600.0,
    step_s: float | None = None,
    rate_window: str = "1m",
) -> list[Path]:
    """Write ``throughput.png``, ``latency.png``, ``dlq.png`` and ``batch_rows.png``.

    Args:
        out_dir: created when missing; existing files of the same names are replaced.
        prometheus_url: the Prometheus that scraped the run.
        start: unix seconds; default ``end - since_s``.
        end: unix seconds; default now.
        since_s: the range when ``start`` is not given (see :func:`parse_duration`).
        step_s: resolution; default about 300 points over the range, at least 1 s.
        rate_window: the ``rate()`` window, at least two scrape intervals (e.g. ``1m``).

    Returns:
        The PNG paths, in the order above.

    Example::

        write_report(Path("artifacts/report"), "http://127.0.0.1:9090", since_s=1800)
    """
    end = time.time() if end is None else end
    start = end - since_s if start is None else start
    if start >= end:
        raise ValueError("start must be before end")
    step = step_s or max(1.0, (end - start) / 300)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for plot in PLOTS:
        path = out_dir / f"{plot.name}.png"
        figure = _render(plot, prometheus_url, start, end, step, rate_window)
        FigureCanvasAgg(figure).print_png(str(path))
        paths.append(path)
    return paths
