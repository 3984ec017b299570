"""What one run of the scoring loop did: counts, throughput and latency quantiles.

A run summary is printed as one line of strict JSON (:func:`json_line`: ``null``, never
``NaN``). With several ranks, each rank writes its summary record and the launcher merges them
into one summary of the job (:mod:`pipeline.jobs.summaries`).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

_MAX_LATENCY_SAMPLES = 1_000_000
"""Latencies kept per run (per rank): the first this many events' (a run's percentiles are over
them)."""


class LatencySamples:
    """End-to-end latencies in seconds, kept in one float64 array that grows by doubling, up to
    ``limit`` samples (the first ``limit`` events'; later ones are counted nowhere else). No
    Python object per event: 8 bytes per sample.

    Args:
        limit: the most samples kept.

    Example::

        samples = LatencySamples()
        samples.add(np.array([0.010, 0.020]))
        samples.values  # array([0.01, 0.02])
    """

    def __init__(self, limit: int = _MAX_LATENCY_SAMPLES) -> None:
        self._limit = limit
        self._buffer: npt.NDArray[np.float64] = np.empty(min(limit, 1024), dtype=np.float64)
        self._size = 0

    def add(self, latency_s: npt.ArrayLike) -> None:
        """Keep ``latency_s`` (as many as fit under the limit)."""
        new = np.asarray(latency_s, dtype=np.float64).ravel()[: self._limit - self._size]
        end = self._size + new.size
        if end > self._buffer.size:
            grown = np.empty(min(self._limit, max(end, 2 * self._buffer.size)), dtype=np.float64)
            grown[: self._size] = self._buffer[: self._size]
            self._buffer = grown
        self._buffer[self._size : end] = new
        self._size = end

    @property
    def values(self) -> npt.NDArray[np.float64]:
        """The kept samples (a view: copy it to keep it past the next :meth:`add`)."""
        return self._buffer[: self._size]

    def __len__(self) -> int:
        return self._size


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
    latencies: LatencySamples = field(default_factory=LatencySamples)
    """The events' end-to-end latencies (:attr:`latencies_s` reads them)."""
    workers: list[dict[str, Any]] = field(default_factory=list)
    """With ingest workers (:mod:`pipeline.ingest`): each worker's own figures (the counts
    above are their sums)."""

    def record_batch(self, events: int, rows: int, latency_s: npt.NDArray[np.float64]) -> None:
        """Count one published batch and keep its events' latencies (up to a bound)."""
        self.events_out += events
        self.rows_scored += rows
        self.batches += 1
        self.last_output_at = time.monotonic()
        self.latencies.add(latency_s)

    @property
    def latencies_s(self) -> npt.NDArray[np.float64]:
        """The kept latencies, in seconds, in the order their batches were published."""
        return self.latencies.values

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
        samples = self.latencies_s
        return float(np.quantile(samples, q)) if samples.size else float("nan")

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
            **latency_percentiles_ms(self.latencies_s),
            **({"workers": self.workers} if self.workers else {}),
        }


def latency_percentiles_ms(latencies_s: npt.NDArray[np.float64]) -> dict[str, float | None]:
    """p50 and p99 in milliseconds (rounded to 0.01 ms) of ``latencies_s``; ``None`` when empty.

    Args:
        latencies_s: end-to-end latencies in seconds.

    Returns:
        ``{"latency_p50_ms": ..., "latency_p99_ms": ...}``.

    Example::

        latency_percentiles_ms(np.array([0.010, 0.020]))["latency_p50_ms"]  # 15.0
    """
    out: dict[str, float | None] = {}
    for name, q in (("latency_p50_ms", 0.5), ("latency_p99_ms", 0.99)):
        quantile = float(np.quantile(latencies_s, q)) if latencies_s.size else None
        out[name] = None if quantile is None else round(quantile * 1000, 2)
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
