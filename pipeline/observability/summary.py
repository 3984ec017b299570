"""What one run of the scoring loop did: counts, throughput and latency quantiles.

A run summary is printed as one line of strict JSON (:func:`json_line`: ``null``, never
``NaN``). Its latency quantiles are over every event of the run, in constant memory
(:class:`~pipeline.observability.latency_sketch.LatencySketch`: within 0.5 %). With several
ranks, each rank writes a record (its figures and its sketch) that the launcher merges into one
summary of the job (:mod:`pipeline.jobs.summaries`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.observability.latency_sketch import LatencySketch


@dataclass
class RunSummary:
    """What one run did (printed by ``streamrank run`` and the demo)."""

    events_in: int = 0
    events_out: int = 0
    dead_lettered: int = 0
    rows_scored: int = 0
    batches: int = 0
    seconds: float = 0.0
    first_input_at: float | None = None
    last_output_at: float | None = None
    latencies: LatencySketch = field(default_factory=LatencySketch)
    """The end-to-end latencies of every event of the run (a fixed-size sketch)."""
    workers: list[dict[str, Any]] = field(default_factory=list)
    """With ingest workers (:mod:`pipeline.ingest`): each worker's own figures (the counts
    above are their sums)."""

    def record_batch(self, events: int, rows: int, latency_s: npt.NDArray[np.float64]) -> None:
        """Count one published batch and its events' latencies."""
        self.events_out += events
        self.rows_scored += rows
        self.batches += 1
        self.last_output_at = time.monotonic()
        self.latencies.add(latency_s)

    @property
    def busy_seconds(self) -> float:
        """From the first message consumed to the last batch produced (idle time excluded)."""
        if self.first_input_at is None or self.last_output_at is None:
            return 0.0
        return self.last_output_at - self.first_input_at

    @property
    def events_per_s(self) -> float:
        return self.events_out / self.busy_seconds if self.busy_seconds else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows_scored / self.busy_seconds if self.busy_seconds else 0.0

    def latency_quantile(self, q: float) -> float:
        """The run's ``q``-quantile latency in seconds (within 0.5 %; NaN before any output)."""
        return self.latencies.quantile(q)

    def as_dict(self) -> dict[str, Any]:
        """The summary's figures (latencies ``None`` when no event was produced).

        Example::

            json_line(summary.as_dict())
        """
        return {
            "events_in": self.events_in,
            "events_out": self.events_out,
            "dead_lettered": self.dead_lettered,
            "rows_scored": self.rows_scored,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "busy_seconds": round(self.busy_seconds, 3),
            "events_per_s": round(self.events_per_s, 1),
            "rows_per_s": round(self.rows_per_s, 1),
            **latency_percentiles_ms(self.latencies),
            **({"workers": self.workers} if self.workers else {}),
        }


def latency_percentiles_ms(latencies: LatencySketch) -> dict[str, float | None]:
    """p50 and p99 in milliseconds (rounded to 0.01 ms) of ``latencies``; ``None`` when empty.

    Args:
        latencies: a run's latency sketch (within 0.5 % of the exact quantiles).

    Returns:
        ``{"latency_p50_ms": ..., "latency_p99_ms": ...}``.

    Example::

        sketch = LatencySketch()
        sketch.add(np.array([0.010, 0.020]))
        latency_percentiles_ms(sketch)["latency_p50_ms"]  # 10.0 within 0.5 %
    """
    out: dict[str, float | None] = {}
    for name, q in (("latency_p50_ms", 0.5), ("latency_p99_ms", 0.99)):
        out[name] = round(latencies.quantile(q) * 1000, 2) if len(latencies) else None
    return out


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, inf) made ``None``, containers walked."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_line(value: Any) -> str:
    """``value`` as one line of strict JSON: NaN and infinities become ``null``.

    Args:
        value: JSON-ready data (dicts, lists, numbers, strings).

    Returns:
        The JSON text, without a newline.

    Example::

        json_line({"latency_p50_ms": float("nan")})  # '{"latency_p50_ms": null}'
    """
    return json.dumps(_finite(value), allow_nan=False)
