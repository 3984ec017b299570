"""A Prometheus histogram observed a batch at a time: one numpy bucket count per batch, no
Python call per value.

``prometheus_client``'s :class:`~prometheus_client.Histogram` takes one value per ``observe``
(a Python loop over the buckets each time) and lets a caller set bucket counts only through its
internals. :class:`BatchHistogram` is a collector of its own that exposes exactly what that
histogram exposes for the same name and buckets (``_bucket{le=...}`` cumulative, ``_count``,
``_sum``, ``_created``), with the same rule for a value on a bound (``value <= le``).

Example::

    latency = BatchHistogram("app_latency_seconds", "Latency.", (0.1, 1.0), registry)
    latency.observe_many(np.array([0.05, 0.5, 2.0]))
    latency.observe(0.3)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt
import prometheus_client.metrics
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["BatchHistogram"]


class BatchHistogram(Collector):
    """A histogram without labels whose observations arrive as arrays.

    Args:
        name: the metric name (``_bucket``/``_count``/``_sum``/``_created`` are appended).
        documentation: its help text.
        buckets: upper bounds, increasing (``+Inf`` is added when missing).
        registry: where to register it (``None``: nowhere).
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        registry: CollectorRegistry | None,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("buckets must be in increasing order")
        if not bounds or bounds[-1] != float("inf"):
            bounds.append(float("inf"))
        self._name = name
        self._documentation = documentation
        self._bounds = np.asarray(bounds, dtype=np.float64)
        self._labels = [floatToGoString(b) for b in bounds]
        self._counts = np.zeros(len(bounds), dtype=np.int64)
        self._sum = 0.0
        self._created = time.time()
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def observe(self, value: float) -> None:
        """Observe one value."""
        self.observe_many(np.asarray([value], dtype=np.float64))

    def observe_many(self, values: npt.ArrayLike) -> None:
        """Observe every value of ``values`` (one bucket count for all of them).

        A value lands in the first bucket whose bound is ``>= value``; a NaN lands in none
        (but is added to the sum), as with ``prometheus_client``.
        """
        array = np.asarray(values, dtype=np.float64).reshape(-1)
        if not array.size:
            return
        index = np.searchsorted(self._bounds, array, side="left")
        counts = np.bincount(index, minlength=len(self._bounds) + 1)[: len(self._bounds)]
        total = float(array.sum())
        with self._lock:
            self._counts += counts
            self._sum += total

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            cumulative = np.cumsum(self._counts).tolist()
            total = self._sum
        metric = Metric(self._name, self._documentation, "histogram")
        for label, count in zip(self._labels, cumulative, strict=True):
            metric.add_sample(f"{self._name}_bucket", {"le": label}, float(count))
        metric.add_sample(f"{self._name}_count", {}, float(cumulative[-1]))
        if self._bounds[0] >= 0:  # as prometheus_client: no sum when values may be negative
            metric.add_sample(f"{self._name}_sum", {}, total)
        if getattr(prometheus_client.metrics, "_use_created", True):
            metric.add_sample(f"{self._name}_created", {}, self._created)
        yield metric

    def describe(self) -> Iterable[Metric]:
        return [Metric(self._name, self._documentation, "histogram")]
