"""Latency quantiles over a whole run in constant memory: a log-bucketed histogram.

Every latency ``x`` falls in bucket ``i = ceil(log_g(x / MIN_S))`` with ``g = (1 + a) / (1 - a)``
(``a`` the relative error, :data:`RELATIVE_ERROR`), so bucket ``i`` holds the values in
``(MIN_S * g**(i-1), MIN_S * g**i]``, and its representative ``2 * MIN_S * g**i / (g + 1)`` lies
within ``a`` (relative) of every one of them: the idea of DDSketch (Masson, Rim and Lee, VLDB
2019), on a fixed range so that two sketches merge by adding their counts.

**Error bound.** For latencies in ``[MIN_S, MAX_S]`` (1 µs to 1 day), :meth:`LatencySketch.quantile`
returns ``np.quantile(latencies, q)`` (numpy's default, linear interpolation between the two
samples around rank ``q * (n - 1)``) within ``a = 0.5 %`` relative, however many latencies
were added: each of the two samples is replaced by its bucket's representative (within ``a``),
and interpolating keeps the bound. Latencies at or below ``MIN_S`` (zero, or negative after a
clock step) count in a zero bucket reported as ``0.0`` (an absolute error of at most 1 µs);
latencies above ``MAX_S`` count in the last bucket. Memory: one int64 per bucket, 2,520 of
them (20 KiB), whatever the run's length; adding a batch is one compiled pass over it.

Example::

    sketch = LatencySketch()
    sketch.add(np.array([0.010, 0.020, 0.030]))
    sketch.quantile(0.5)           # 0.0200 within 0.5 %
    sketch.merge(other_ranks_sketch)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from model.kernels import kernel

__all__ = ["MAX_S", "MIN_S", "RELATIVE_ERROR", "LatencySketch"]

RELATIVE_ERROR = 0.005
"""The relative error bound ``a`` of every quantile (see the module docstring)."""
MIN_S = 1e-6
"""Latencies at or below this (seconds) count as zero."""
MAX_S = 86_400.0
"""Latencies above this (seconds) count in the last bucket."""

_GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(_GAMMA)
_BUCKETS = math.ceil(math.log(MAX_S / MIN_S) / _LOG_GAMMA) + 1
"""Bucket 0 is the zero bucket; bucket ``i >= 1`` ends at ``MIN_S * g**i``."""


class LatencySketch:
    """Counts of latencies (seconds) in log-spaced buckets (see the module docstring).

    Example::

        sketch = LatencySketch()
        sketch.add(latencies_s)
        p99 = sketch.quantile(0.99)
    """

    def __init__(self) -> None:
        self.counts: npt.NDArray[np.int64] = np.zeros(_BUCKETS, dtype=np.int64)
        _count(np.zeros(0), self.counts, MIN_S, _LOG_GAMMA)  # load (or compile) it now

    def add(self, latency_s: npt.ArrayLike) -> None:
        """Count ``latency_s`` (any shape; seconds). One compiled pass, no object per value."""
        values = np.asarray(latency_s, dtype=np.float64).ravel()
        if values.size:
            _count(values, self.counts, MIN_S, _LOG_GAMMA)

    def merge(self, other: LatencySketch) -> None:
        """Add ``other``'s counts (another rank's or worker's run): as if every latency had
        been added here."""
        self.counts += other.counts

    def __len__(self) -> int:
        return int(self.counts.sum())

    def quantile(self, q: float) -> float:
        """The ``q``-quantile (seconds) as ``np.quantile(latencies, q)`` (linear interpolation
        between the samples of ranks ``floor(h)`` and ``floor(h) + 1``, ``h = q * (n - 1)``),
        within :data:`RELATIVE_ERROR`; NaN when empty.

        Args:
            q: in ``[0, 1]``.
        """
        n = len(self)
        if n == 0:
            return float("nan")
        h = q * (n - 1)
        low = math.floor(h)
        ends = np.cumsum(self.counts)
        below, above = (
            self._value(int(np.searchsorted(ends, rank, side="right")))
            for rank in (low, min(low + 1, n - 1))
        )
        return below + (h - low) * (above - below)

    @staticmethod
    def _value(bucket: int) -> float:
        """The representative of ``bucket``: within the relative error of all its values."""
        return 0.0 if bucket == 0 else 2 * MIN_S * _GAMMA**bucket / (_GAMMA + 1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the bound and the non-empty buckets (``{"index": count}``)."""
        nonzero = np.flatnonzero(self.counts)
        return {
            "relative_error": RELATIVE_ERROR,
            "min_s": MIN_S,
            "max_s": MAX_S,
            "counts": {str(i): int(self.counts[i]) for i in nonzero.tolist()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LatencySketch:
        """Parse :meth:`to_dict`'s output.

        Raises:
            ValueError: a sketch of other parameters (it would not merge).
        """
        if (data.get("relative_error"), data.get("min_s"), data.get("max_s")) != (
            RELATIVE_ERROR,
            MIN_S,
            MAX_S,
        ):
            raise ValueError("a latency sketch of other parameters than this version's")
        sketch = cls()
        for index, count in dict(data["counts"]).items():
            sketch.counts[int(index)] = int(count)
        return sketch


@kernel
def _count(
    values: npt.NDArray[np.float64], counts: npt.NDArray[np.int64], min_s: float, log_gamma: float
) -> None:
    """Add each value to its bucket of ``counts``: the zero bucket at or below ``min_s`` (and
    for NaN), the last bucket beyond it."""
    last = len(counts) - 1
    for v in values:
        if not v > min_s:  # zero, negative or NaN
            counts[0] += 1
        elif v == np.inf:
            counts[last] += 1
        else:
            counts[min(max(math.ceil(math.log(v / min_s) / log_gamma), 1), last)] += 1
