"""Metrics of the ingest workers on their rank's one Prometheus endpoint.

Each worker counts into a registry of its own (the usual
:class:`~pipeline.observability.metrics.Metrics`) and sends a :func:`snapshot` of it to the rank
every second and when it stops (:class:`MetricsRelay`). The rank serves one endpoint whose families
merge its own registry with the latest snapshot of every worker (:class:`MergedMetrics`), so
dashboards and alerts read the same series as with one process:

- counters, histograms and summaries are summed over the workers (their ``_created`` sample is
  the earliest);
- ``streamrank_feature_cache_hit_ratio`` is recomputed from the summed cache requests;
- other gauges (consumer lag per partition) take the largest value a worker reports;
- the families of the rank itself (:data:`RANK_FAMILIES`: model, embedding bytes, world size,
  step and collective times, GPU) come from the rank's registry alone.

Why not ``prometheus_client``'s multiprocess mode: it needs a directory shared by every process
before the first import, turns gauges into per-process series and custom collectors (commit
failures, GPU) off. Why not one port per worker: scrape configs would need to know K. A snapshot
per second costs a few hundred microseconds of the rank's time.

Example::

    relay = MetricsRelay(worker_metrics.registry, link.send)     # in a worker
    relay.start(); ...; relay.stop()
    merged = MergedMetrics(rank_metrics.registry)                 # in the rank
    merged.update(worker=1, families=report.families)
    rank_metrics.serve(host, port, registry=merged.registry)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from pipeline.ingest.transport import MetricsReport

__all__ = ["RANK_FAMILIES", "FamilySnapshot", "MergedMetrics", "MetricsRelay", "snapshot"]

RANK_FAMILIES = frozenset(
    {
        "streamrank_rank_up",
        "streamrank_world_size",
        "streamrank_degradations",
        "streamrank_embedding_bytes",
        "streamrank_model",
        "streamrank_model_swaps",
        "streamrank_model_load_failures",
        "streamrank_model_load_seconds",
        "streamrank_gpu_memory_bytes",
        "streamrank_gpu_utilization_ratio",
        "streamrank_rank_step_duration_seconds",
        "streamrank_collective_duration_seconds",
    }
)
"""Families the rank's process owns: taken from its registry, never from a worker's."""

_HIT_RATIO = "streamrank_feature_cache_hit_ratio"
_CACHE_REQUESTS = "streamrank_feature_cache_requests_total"

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class FamilySnapshot:
    """One metric family's samples at a moment (picklable, no client objects)."""

    name: str
    type: str
    documentation: str
    unit: str
    samples: list[tuple[str, Labels, float]] = field(default_factory=list)


def snapshot(registry: CollectorRegistry) -> list[FamilySnapshot]:
    """Every family of ``registry`` with its samples now.

    Example::

        MetricsReport(snapshot(metrics.registry))
    """
    return [
        FamilySnapshot(
            family.name,
            family.type,
            family.documentation,
            family.unit,
            [(s.name, tuple(sorted(s.labels.items())), float(s.value)) for s in family.samples],
        )
        for family in registry.collect()
    ]


class MetricsRelay:
    """Sends a worker's metrics to its rank every ``interval_s`` on a daemon thread.

    Args:
        registry: the worker's registry.
        send: delivers a :class:`~pipeline.ingest.transport.MetricsReport` (the worker's link);
            a failure ends the relay quietly (the rank is going away).
        interval_s: seconds between two reports.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        send: Callable[[MetricsReport], None],
        interval_s: float = 1.0,
    ) -> None:
        self._registry = registry
        self._send = send
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-relay", daemon=True)

    def start(self) -> None:
        """Start reporting."""
        self._thread.start()

    def stop(self) -> None:
        """Stop reporting (the worker's last figures go with its summary)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self._send(MetricsReport(snapshot(self._registry)))
            except OSError:
                return


class _Family:
    """Samples of one family merged over sources (see the module docstring)."""

    def __init__(self, source: FamilySnapshot) -> None:
        self.source = source
        self.values: dict[tuple[str, Labels], float] = {}

    def add(self, name: str, labels: Labels, value: float) -> None:
        key = (name, labels)
        if key not in self.values:
            self.values[key] = value
        elif name.endswith("_created"):
            self.values[key] = min(self.values[key], value)
        elif self.source.type == "gauge":
            self.values[key] = max(self.values[key], value)
        else:
            self.values[key] += value

    def metric(self) -> Metric:
        src = self.source
        metric = Metric(src.name, src.documentation, src.type, src.unit)
        for (name, labels), value in self.values.items():
            metric.add_sample(name, dict(labels), value)
        return metric


class MergedMetrics(Collector):
    """The rank's registry and its workers' latest snapshots, as one set of families.

    Args:
        own: the rank's registry.

    Attributes:
        registry: a registry holding only this collector: serve it.
    """

    def __init__(self, own: CollectorRegistry) -> None:
        self._own = own
        self._workers: dict[int, list[FamilySnapshot]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def update(self, worker: int, families: list[FamilySnapshot]) -> None:
        """Keep ``worker``'s latest snapshot (it replaces the previous one; a worker that has
        stopped keeps its last, so counters never go back)."""
        self._workers[worker] = families

    def collect(self) -> Iterable[Metric]:
        merged: dict[str, _Family] = {}
        sources = [snapshot(self._own), *list(self._workers.values())]
        for index, families in enumerate(sources):
            for family in families:
                if index and family.name in RANK_FAMILIES:
                    continue
                target = merged.setdefault(family.name, _Family(family))
                for name, labels, value in family.samples:
                    target.add(name, labels, value)
        _recompute_hit_ratio(merged)
        return [family.metric() for family in merged.values()]


def _recompute_hit_ratio(merged: dict[str, _Family]) -> None:
    """``streamrank_feature_cache_hit_ratio`` from the summed cache requests (a ratio does not
    add up)."""
    ratio = merged.get(_HIT_RATIO)
    requests = merged.get(_CACHE_REQUESTS.removesuffix("_total"))
    if ratio is None or requests is None:
        return
    hits = lookups = 0.0
    for (name, labels), value in requests.values.items():
        if name == _CACHE_REQUESTS:
            lookups += value
            hits += value if dict(labels).get("result") == "hit" else 0.0
    for key in ratio.values:
        ratio.values[key] = hits / lookups if lookups else 0.0
