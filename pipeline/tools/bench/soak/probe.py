"""What ``streamrank bench soak`` measures of a running pipeline, from outside it.

- resident memory of its process (``/proc/<pid>/status``);
- consumer lag of its group: end of each input partition minus the group's committed offset;
- end-to-end latency quantiles over a time window, from two scrapes of its Prometheus
  histogram (``streamrank_end_to_end_latency_seconds``), interpolated within buckets as
  PromQL's ``histogram_quantile`` does;
- the event ids on a topic, read up to the end the topic had when reading started.

Example::

    scrape = MetricsScrape.fetch(9464)
    ...
    p99_s = window_quantile(0.99, earlier, scrape)
"""

from __future__ import annotations

import math
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import KafkaError, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from pipeline.connectors.kafka.clients import make_consumer
from pipeline.settings.kafka import KafkaSettings

LATENCY_METRIC = "streamrank_end_to_end_latency_seconds"
OUTPUT_METRIC = "streamrank_produced_recommendations_total"
BATCH_ROWS_METRIC = "streamrank_batch_rows"


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (Linux ``VmRSS``).

    Raises:
        ProcessLookupError: the process is gone.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError as exc:
        raise ProcessLookupError(pid) from exc
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ProcessLookupError(pid)  # a zombie has no VmRSS


def consumer_lag(kafka: KafkaSettings, group_id: str, topic: str) -> int:
    """Messages on ``topic`` the group ``group_id`` has not committed yet (all partitions).

    Reads the committed offsets without joining the group.

    Args:
        kafka: the cluster.
        group_id: the consumer group to measure.
        topic: its input topic.

    Returns:
        Sum over partitions of (high watermark - committed offset); a partition without a
        committed offset counts from its low watermark.
    """
    consumer = make_consumer(kafka.config, group_id=group_id)
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        partitions = [TopicPartition(topic, p) for p in sorted(metadata.partitions)]
        committed = consumer.committed(partitions, timeout=10)
        lag = 0
        for tp in committed:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=10
            )
            lag += high - (tp.offset if tp.offset >= 0 else low)
        return lag
    finally:
        consumer.close()


@dataclass(frozen=True)
class MetricsScrape:
    """The few series the soak reads from one scrape of a pipeline's ``/metrics``.

    Attributes:
        latency_buckets: ``(upper bound, cumulative count)`` of the end-to-end latency
            histogram, ascending, ``+Inf`` last.
        recommendations: ``streamrank_produced_recommendations_total``.
        batch_rows_buckets: ``(upper bound, cumulative count)`` of the rows per batch.
    """

    latency_buckets: tuple[tuple[float, float], ...] = ()
    recommendations: float = 0.0
    batch_rows_buckets: tuple[tuple[float, float], ...] = ()

    @classmethod
    def parse(cls, text: str) -> MetricsScrape:
        """Read a Prometheus text exposition."""
        buckets: list[tuple[float, float]] = []
        rows: list[tuple[float, float]] = []
        recommendations = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == f"{LATENCY_METRIC}_bucket":
                    buckets.append((float(sample.labels["le"]), sample.value))
                elif sample.name == f"{BATCH_ROWS_METRIC}_bucket":
                    rows.append((float(sample.labels["le"]), sample.value))
                elif sample.name == OUTPUT_METRIC:
                    recommendations = sample.value
        return cls(tuple(sorted(buckets)), recommendations, tuple(sorted(rows)))

    @classmethod
    def fetch(cls, port: int, host: str = "127.0.0.1", timeout_s: float = 5.0) -> MetricsScrape:
        """Scrape ``http://host:port/metrics``.

        Raises:
            OSError: nothing answers there (yet).
        """
        url = f"http://{host}:{port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return cls.parse(response.read().decode())


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a cumulative histogram, as PromQL's ``histogram_quantile``.

    Linear interpolation inside the bucket the rank falls in (from 0 for the first bucket);
    a rank in the ``+Inf`` bucket gives the largest finite bound.

    Args:
        q: the quantile, 0..1.
        buckets: ``(upper bound, cumulative count)``, ascending, ``+Inf`` last.

    Returns:
        The quantile, or ``None`` without observations.

    Example::

        bucket_quantile(0.5, [(0.1, 0), (0.2, 10), (math.inf, 10)])  # 0.15
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def window_quantile(q: float, earlier: MetricsScrape, later: MetricsScrape) -> float | None:
    """The ``q`` latency quantile of the events produced between two scrapes.

    Returns:
        Seconds, or ``None`` when no event was produced in between (or the process
        restarted and its counters went back).
    """
    before = dict(earlier.latency_buckets)
    window = [(le, count - before.get(le, 0.0)) for le, count in later.latency_buckets]
    if any(count < 0 for _, count in window):
        return None
    return bucket_quantile(q, window)


def window_max_bound(earlier: MetricsScrape, later: MetricsScrape) -> float | None:
    """The upper bound of the highest batch-rows bucket that counted a batch between two
    scrapes (``inf``: a batch above the last finite bound; ``None``: no batch)."""
    before = dict(earlier.batch_rows_buckets)
    highest = None
    below = 0.0
    for bound, count in later.batch_rows_buckets:
        in_bucket = (count - before.get(bound, 0.0)) - below
        below = count - before.get(bound, 0.0)
        if in_bucket > 0:
            highest = bound
    return highest


@dataclass
class TopicIds:
    """Event ids read from a topic: how many records, and each id's count."""

    records: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, event_id: str) -> None:
        self.records += 1
        self.counts[event_id] = self.counts.get(event_id, 0) + 1


def topic_event_ids(kafka: KafkaSettings, topic: str, event_id: Callable[[bytes], str]) -> TopicIds:
    """The event id of every record on ``topic`` up to its end when the read starts.

    Args:
        kafka: the cluster.
        topic: the topic to read (every partition, from its beginning).
        event_id: decodes one record value into its event id.

    Returns:
        Record count and per-id counts.
    """
    out = TopicIds()
    for value in _values_to_end(kafka, topic):
        out.add(event_id(value))
    return out


def _values_to_end(kafka: KafkaSettings, topic: str) -> Iterator[bytes]:
    for _, _, value in topic_messages(kafka, topic):
        yield value


def topic_messages(kafka: KafkaSettings, topic: str) -> Iterator[tuple[int, int, bytes]]:
    """``(partition, offset, value)`` of every record on ``topic`` (all partitions, from their
    beginning) up to the end the topic had when the read started."""
    consumer = make_consumer(
        kafka.config,
        group_id=f"soak-audit-{uuid.uuid4().hex[:8]}",
        extra={"enable.partition.eof": True},
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        ends: dict[int, int] = {}
        starts = []
        for p in sorted(metadata.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
                starts.append(TopicPartition(topic, p, low))
        consumer.assign(starts)
        while ends:
            for msg in consumer.consume(1000, 1.0):
                partition = msg.partition()
                if partition not in ends:
                    continue
                if msg.error() is None:
                    offset = msg.offset()
                    if offset is not None and offset < ends[partition]:
                        yield partition, offset, msg.value() or b""
                    if offset is not None and offset + 1 >= ends[partition]:
                        del ends[partition]
                elif _is_eof(msg.error()):
                    del ends[partition]
    finally:
        consumer.close()


def _is_eof(error: KafkaError | None) -> bool:
    """Whether a consume error is librdkafka's end-of-partition event."""
    return error is not None and error.code() == KafkaError._PARTITION_EOF
