"""Prometheus metrics of the pipeline, served on ``metrics.host:metrics.port`` (rank r of a
multi-rank job on ``port + r``).

Names follow the Prometheus conventions: base units in the name (``_seconds``, ``_bytes``,
``_ratio``, ``_messages``), ``_total`` on counters. Label values that are known in advance
(DLQ reasons, fallback features, stages) are created at zero, so rates and alerts have a series
before the first event of each kind.

=================================================  =========  ====================================
metric                                             type       labels / meaning
=================================================  =========  ====================================
``streamrank_consumed_messages_total``             counter    messages consumed (valid or not)
``streamrank_produced_recommendations_total``      counter    recommendations produced
``streamrank_dead_letter_messages_total``          counter    ``reason``: messages sent to the DLQ
``streamrank_batch_rows``                          histogram  rows (event x candidate) per batch
``streamrank_stage_duration_seconds``              histogram  ``stage``: decode, retrieve,
                                                              enrich, features, forward, produce
``streamrank_end_to_end_latency_seconds``          histogram  event_time -> produced
``streamrank_feature_cache_requests_total``        counter    ``kind`` (user/item), ``result``
                                                              (hit/miss)
``streamrank_feature_cache_hit_ratio``             gauge      hits / requests since start
``streamrank_feature_fallback_events_total``       counter    ``feature``: events served defaults
``streamrank_retrieved_events_total``              counter    events given retrieved candidates
``streamrank_embedding_bytes``                     gauge      embedding bytes held by this rank
``streamrank_consumer_lag_messages``               gauge      ``topic``, ``partition``
``streamrank_commit_failures_total``               counter    offset commits that failed (each is
                                                              retried with the next commit)
``streamrank_rank_step_duration_seconds``          histogram  ``rank``: one scoring step
``streamrank_collective_duration_seconds``         histogram  ``rank``, ``op``: a collective call
``streamrank_rank_up``                             gauge      ``rank``: 1 while the rank serves
``streamrank_world_size``                          gauge      ranks in this job
``streamrank_degradations``                        gauge      times ``streamrank run`` restarted
                                                              the job with fewer ranks
``streamrank_gpu_memory_bytes``                    gauge      ``rank``, ``kind`` (allocated,
                                                              reserved, total); GPU ranks only
``streamrank_gpu_utilization_ratio``               gauge      ``rank``; GPU ranks with NVML only
``streamrank_model_info``                         info       ``model_version``: the served version
``streamrank_model_swaps_total``                   counter    newly promoted versions swapped in
``streamrank_model_load_failures_total``           counter    promoted versions that failed to
                                                              load (the old one kept serving)
``streamrank_model_load_seconds``                  gauge      last successful load (weights,
                                                              retrieval index) off the loop
=================================================  =========  ====================================
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from model.rank import RankContext
from pipeline.observability.batch_histogram import BatchHistogram
from pipeline.types import RejectReason

log = logging.getLogger(__name__)

STAGES = ("decode", "retrieve", "enrich", "features", "forward", "produce")
FALLBACK_FEATURES = ("user_features", "item_features")
"""Values of :class:`pipeline.types.FallbackFeature`."""
STEP_AGREE = "step_agree"
"""``op`` label of the ranks' per-iteration all_reduce
(:class:`~pipeline.runtime.stepping.StepAgreement` over a process group)."""

# fmt: off
_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
# fmt: on
_ROW_BUCKETS = tuple(float(2**k) for k in range(0, 17))


class GpuCollector(Collector):
    """Reads the memory and utilisation of this rank's GPU from ``torch.cuda`` at scrape time.

    Yields nothing unless this process has initialised CUDA and bound a GPU (CPU runs export
    no GPU series). The device is the one the rank serves on
    (:func:`model.serving.device.bound_device`),
    not the scrape thread's current device nor a guess from ``LOCAL_RANK``.

    Args:
        rank: the ``rank`` label.
    """

    def __init__(self, rank: str) -> None:
        self._rank = rank

    def collect(self) -> Iterable[Metric]:
        import torch

        from model.serving.device import bound_device

        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return []
        device = bound_device()
        if device is None:
            return []
        memory = GaugeMetricFamily(
            "streamrank_gpu_memory_bytes",
            "GPU memory of this rank's device: allocated by tensors, reserved by the caching "
            "allocator, total on the device.",
            labels=["rank", "kind"],
        )
        memory.add_metric([self._rank, "allocated"], torch.cuda.memory_allocated(device))
        memory.add_metric([self._rank, "reserved"], torch.cuda.memory_reserved(device))
        total = torch.cuda.get_device_properties(device).total_memory
        memory.add_metric([self._rank, "total"], total)
        out: list[Metric] = [memory]
        try:
            busy = torch.cuda.utilization(device)  # needs NVML (pynvml / nvidia-ml-py)
        except Exception:  # no NVML: memory only
            return out
        util = GaugeMetricFamily(
            "streamrank_gpu_utilization_ratio",
            "Fraction of the last sample period the GPU was busy (NVML).",
            labels=["rank"],
        )
        util.add_metric([self._rank], busy / 100.0)
        out.append(util)
        return out


class CommitFailures(Collector):
    """``streamrank_commit_failures_total``: offset commits that failed, read at scrape time from
    the committer's own count (``Checkpointer.commit_failures``), so the commit protocol needs
    no reference to the metrics. Exported at 0 before a committer is watched.

    Example::

        metrics.commit_failures.watch(lambda: checkpointer.commit_failures)
    """

    def __init__(self) -> None:
        self._earlier = 0
        self._counted: Callable[[], int] | None = None

    def watch(self, counted: Callable[[], int]) -> None:
        """Count what ``counted()`` returns from now on, on top of the committers watched before
        (a new run of the loop builds a new committer; the counter never goes back).

        Args:
            counted: the failures the current committer has seen so far.
        """
        if self._counted is not None:
            self._earlier += self._counted()
        self._counted = counted

    @property
    def value(self) -> int:
        """Failed commits of every committer watched so far."""
        return self._earlier + (self._counted() if self._counted is not None else 0)

    def collect(self) -> Iterable[Metric]:
        yield CounterMetricFamily(
            "streamrank_commit_failures",
            "Offset commits that failed (logged; the offsets are retried with the next commit).",
            value=self.value,
        )


class Metrics:
    """All metrics, in a registry of their own (so tests and ranks do not collide).

    Args:
        registry: the registry (a fresh one by default).
        rank: this process's place in the job (the ``rank`` label, ``streamrank_world_size``).
        degradations: times the launcher restarted the job with fewer ranks.

    Example::

        metrics = Metrics()
        with metrics.stage("enrich"):
            ...
        with metrics.step():
            ...  # one scoring step of this rank
        metrics.serve("127.0.0.1", 9464)
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        rank: RankContext | None = None,
        degradations: int = 0,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        context = rank or RankContext()
        self.rank = str(context.rank)
        r = self.registry
        self.events_in = Counter(
            "streamrank_consumed_messages", "Messages consumed (valid or not).", registry=r
        )
        self.events_out = Counter(
            "streamrank_produced_recommendations", "Recommendations produced.", registry=r
        )
        self.dead_lettered = Counter(
            "streamrank_dead_letter_messages", "Messages sent to the DLQ.", ["reason"], registry=r
        )
        self.batch_rows = Histogram(
            "streamrank_batch_rows", "Rows per scored batch.", buckets=_ROW_BUCKETS, registry=r
        )
        self.stage_seconds = self._seconds(
            "streamrank_stage_duration_seconds", "Time per batch in each stage.", "stage"
        )
        self.end_to_end_seconds = BatchHistogram(
            "streamrank_end_to_end_latency_seconds",
            "From event_time to the recommendation produced.",
            _LATENCY_BUCKETS,
            r,
        )
        """Observed a batch at a time (``observe_many``): one bucket count per batch."""
        self.cache_requests = Counter(
            "streamrank_feature_cache_requests",
            "Feature-cache lookups.",
            ["kind", "result"],
            registry=r,
        )
        self.cache_hit_ratio = Gauge(
            "streamrank_feature_cache_hit_ratio", "Feature-cache hits / lookups.", registry=r
        )
        self.retrieved_events = Counter(
            "streamrank_retrieved_events",
            "Events without candidates answered with retrieved ones ([retrieval]).",
            registry=r,
        )
        self.fallbacks = Counter(
            "streamrank_feature_fallback_events",
            "Events scored with default features (Redis down or key missing).",
            ["feature"],
            registry=r,
        )
        self.embedding_bytes = Gauge(
            "streamrank_embedding_bytes",
            "Embedding-table bytes held by this process/rank.",
            registry=r,
        )
        self.consumer_lag = Gauge(
            "streamrank_consumer_lag_messages",
            "Messages behind the partition end (librdkafka statistics).",
            ["topic", "partition"],
            registry=r,
        )
        self.step_seconds = self._seconds(
            "streamrank_rank_step_duration_seconds",
            "One scoring step of this rank: from the step decision to the next agreement.",
            "rank",
        )
        self.collective_seconds = self._seconds(
            "streamrank_collective_duration_seconds",
            "Wall time of one collective call of this rank (waiting for the others included).",
            "rank",
            "op",
        )
        self.rank_up = Gauge(
            "streamrank_rank_up",
            "1 while this rank serves, 0 once it stopped.",
            ["rank"],
            registry=r,
        )
        self.world_size = Gauge("streamrank_world_size", "Ranks in this job.", registry=r)
        self.world_size.set(context.world_size)
        self.degradations = Gauge(
            "streamrank_degradations",
            "Times streamrank run restarted this job with one rank fewer after a rank kept "
            "failing (set by the launcher in STREAMRANK_DEGRADATIONS).",
            registry=r,
        )
        self.degradations.set(degradations)
        r.register(GpuCollector(self.rank))
        self.commit_failures = CommitFailures()
        r.register(self.commit_failures)
        for reason in RejectReason:
            self.dead_lettered.labels(reason=reason.value)
        for feature in FALLBACK_FEATURES:
            self.fallbacks.labels(feature=feature)
        self._stage_histograms = {name: self.stage_seconds.labels(stage=name) for name in STAGES}
        self._step_histogram: Histogram | None = None
        """This rank's step series, made by the first :meth:`record_step` (``labels`` is a
        lookup under a lock: once, not per step)."""
        self._cache_counters: dict[str, tuple[Counter, Counter]] = {}
        """kind -> its (hit, miss) series, made by the first :meth:`record_cache` of the kind."""
        self._hits = 0
        self._lookups = 0
        # Model versions (pipeline/models/watch.py): what is served, swaps, failed loads.
        self.model_info = Info(
            "streamrank_model", "The served model version (label model_version).", registry=r
        )
        self.model_swaps = Counter(
            "streamrank_model_swaps",
            "Times a newly promoted model version was swapped in.",
            registry=r,
        )
        self.model_load_failures = Counter(
            "streamrank_model_load_failures",
            "Promoted model versions that failed to load (the old version kept serving).",
            registry=r,
        )
        self.model_load_seconds = Gauge(
            "streamrank_model_load_seconds",
            "Seconds the last successful model load (and warm-up) took, off the scoring path.",
            registry=r,
        )

    def _seconds(self, name: str, documentation: str, *labels: str) -> Histogram:
        """A latency histogram (``_LATENCY_BUCKETS``) in this registry."""
        return Histogram(
            name, documentation, labels, buckets=_LATENCY_BUCKETS, registry=self.registry
        )

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a block as one observation of ``streamrank_stage_duration_seconds{stage=name}``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe_stage(name, time.perf_counter() - start)

    def observe_stage(self, name: str, seconds: float) -> None:
        """One observation of ``streamrank_stage_duration_seconds{stage=name}``."""
        histogram = self._stage_histograms.get(name) or self.stage_seconds.labels(stage=name)
        histogram.observe(seconds)

    def record_step(self, seconds: float) -> None:
        """One scoring step of this rank took ``seconds``."""
        if self._step_histogram is None:
            self._step_histogram = self.step_seconds.labels(rank=self.rank)
        self._step_histogram.observe(seconds)

    @contextmanager
    def step(self) -> Iterator[None]:
        """Time a block as one scoring step of this rank (see :meth:`record_step`)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record_step(time.perf_counter() - start)

    def record_collective(self, op: str, seconds: float) -> None:
        """One collective call ``op`` (e.g. :data:`STEP_AGREE`) took ``seconds`` on this rank."""
        self.collective_seconds.labels(rank=self.rank, op=op).observe(seconds)

    def set_up(self, up: bool) -> None:
        """Mark this rank as serving (``serve`` does) or stopped (call at shutdown)."""
        self.rank_up.labels(rank=self.rank).set(1 if up else 0)

    def record_cache(self, kind: str, hits: int, misses: int) -> None:
        """Count ``hits`` and ``misses`` of the ``kind`` (user/item) feature cache."""
        series = self._cache_counters.get(kind)
        if series is None:
            series = self._cache_counters[kind] = (
                self.cache_requests.labels(kind=kind, result="hit"),
                self.cache_requests.labels(kind=kind, result="miss"),
            )
        hit, miss = series
        hit.inc(hits)
        miss.inc(misses)
        self._hits += hits
        self._lookups += hits + misses
        if self._lookups:
            self.cache_hit_ratio.set(self._hits / self._lookups)

    def record_librdkafka_stats(self, stats_json: str) -> None:
        """``stats_cb`` of the consumer: copies per-partition ``consumer_lag``."""
        try:
            stats = json.loads(stats_json)
        except ValueError:
            return
        for topic, tstats in stats.get("topics", {}).items():
            for partition, pstats in tstats.get("partitions", {}).items():
                lag = pstats.get("consumer_lag", -1)
                if partition != "-1" and lag >= 0:
                    self.consumer_lag.labels(topic=topic, partition=partition).set(lag)

    def serve(self, host: str, port: int, registry: CollectorRegistry | None = None) -> int:
        """Start the HTTP endpoint (a daemon thread) and mark the rank up.

        Args:
            host: address to bind.
            port: TCP port; 0 picks a free one.
            registry: what to serve instead of :attr:`registry` (a rank with ingest workers
                serves its own merged with theirs: :mod:`pipeline.ingest.relay`).

        Returns:
            The port it listens on.
        """
        server, _ = start_http_server(port, addr=host, registry=registry or self.registry)
        self.set_up(True)
        log.info("metrics on http://%s:%d/metrics", host, server.server_port)
        return int(server.server_port)
