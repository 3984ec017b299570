"""What one run of the scoring loop did: counts, throughput and latency quantiles."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

_MAX_LATENCY_SAMPLES = 1_000_000


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
    latencies_s: list[float] = field(default_factory=list)

    def record_batch(self, events: int, rows: int, latency_s: npt.NDArray[np.float64]) -> None:
        """Count one published batch and keep its events' latencies (up to a bound)."""
        self.events_out += events
        self.rows_scored += rows
        self.batches += 1
        self.last_output_at = time.monotonic()
        if len(self.latencies_s) < _MAX_LATENCY_SAMPLES:
            self.latencies_s.extend(latency_s.tolist())

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
        return float(np.quantile(self.latencies_s, q)) if self.latencies_s else float("nan")

    def as_dict(self) -> dict[str, Any]:
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
            "latency_p50_ms": round(self.latency_quantile(0.5) * 1000, 2),
            "latency_p99_ms": round(self.latency_quantile(0.99) * 1000, 2),
        }
