"""Prometheus metrics of the pipeline, served on ``metrics.host:metrics.port``.

==================================================  ==========  =================================
metric                                              type        labels / meaning
==================================================  ==========  =================================
``streamrank_events_in_total``                      counter     messages consumed
``streamrank_events_out_total``                     counter     recommendations produced
``streamrank_dead_letter_total``                    counter     ``reason``
``streamrank_batch_rows``                           histogram   rows (event x candidate) per batch
``streamrank_stage_seconds``                        histogram   ``stage``: decode, enrich,
                                                                features, forward, produce
``streamrank_end_to_end_seconds``                   histogram   event_time -> produced
``streamrank_feature_cache_requests_total``         counter     ``kind`` (user/item), ``result``
                                                                (hit/miss)
``streamrank_feature_cache_hit_ratio``              gauge       hits / requests since start
``streamrank_feature_fallback_total``               counter     ``feature``: events served
                                                                defaults
``streamrank_embedding_bytes``                      gauge       embedding bytes held by this rank
``streamrank_consumer_lag``                         gauge       ``topic``, ``partition``
==================================================  ==========  =================================
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

STAGES = ("decode", "enrich", "features", "forward", "produce")
_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
_ROW_BUCKETS = tuple(float(2**k) for k in range(0, 17))


class Metrics:
    """All metrics, in a registry of their own (so tests and ranks do not collide).

    Example::

        metrics = Metrics()
        with metrics.stage("enrich"):
            ...
        metrics.serve("127.0.0.1", 9464)
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.events_in = Counter("streamrank_events_in", "Messages consumed.", registry=r)
        self.events_out = Counter("streamrank_events_out", "Recommendations produced.", registry=r)
        self.dead_lettered = Counter(
            "streamrank_dead_letter", "Messages sent to the DLQ.", ["reason"], registry=r
        )
        self.batch_rows = Histogram(
            "streamrank_batch_rows", "Rows per scored batch.", buckets=_ROW_BUCKETS, registry=r
        )
        self.stage_seconds = Histogram(
            "streamrank_stage_seconds",
            "Time per batch in each stage.",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.end_to_end_seconds = Histogram(
            "streamrank_end_to_end_seconds",
            "From event_time to the recommendation produced.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cache_requests = Counter(
            "streamrank_feature_cache_requests",
            "Feature-cache lookups.",
            ["kind", "result"],
            registry=r,
        )
        self.cache_hit_ratio = Gauge(
            "streamrank_feature_cache_hit_ratio", "Feature-cache hits / lookups.", registry=r
        )
        self.fallbacks = Counter(
            "streamrank_feature_fallback",
            "Events scored with default features.",
            ["feature"],
            registry=r,
        )
        self.embedding_bytes = Gauge(
            "streamrank_embedding_bytes",
            "Embedding-table bytes held by this process/rank.",
            registry=r,
        )
        self.consumer_lag = Gauge(
            "streamrank_consumer_lag",
            "Messages behind the partition end.",
            ["topic", "partition"],
            registry=r,
        )
        self._hits = 0
        self._lookups = 0

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a block as one observation of ``streamrank_stage_seconds{stage=name}``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds.labels(stage=name).observe(time.perf_counter() - start)

    def record_cache(self, kind: str, hits: int, misses: int) -> None:
        self.cache_requests.labels(kind=kind, result="hit").inc(hits)
        self.cache_requests.labels(kind=kind, result="miss").inc(misses)
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

    def serve(self, host: str, port: int) -> None:
        """Start the HTTP endpoint (a daemon thread). Port 0 picks a free port."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", host, server.server_port)
