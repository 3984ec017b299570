"""The workers' metrics on the rank's one endpoint: summed, the rank's own families kept."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from model.rank import RankContext
from pipeline.ingest.relay import MergedMetrics, snapshot
from pipeline.observability.metrics import Metrics


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_worker_counts_add_up_and_the_rank_keeps_its_own_families() -> None:
    rank = Metrics(rank=RankContext())
    rank.embedding_bytes.set(1000)
    rank.record_step(0.5)
    workers = [Metrics(rank=RankContext()) for _ in range(2)]
    for n, worker in enumerate(workers, start=1):
        worker.events_in.inc(10 * n)
        worker.stage_seconds.labels(stage="enrich").observe(0.001 * n)
        worker.record_cache("user", hits=3 * n, misses=n)
        worker.consumer_lag.labels(topic="in", partition=str(n)).set(5 * n)
        worker.consumer_lag.labels(topic="in", partition="0").set(n)
        worker.embedding_bytes.set(0)  # a worker holds no tables: never shown
        worker.record_step(9.0)  # its loop's steps are not the rank's scoring steps
    merged = MergedMetrics(rank.registry)
    for index, worker in enumerate(workers):
        merged.update(index, snapshot(worker.registry))

    text = generate_latest(merged.registry).decode()
    values = _samples(text)
    assert values[("streamrank_consumed_messages_total", ())] == 30
    assert values[("streamrank_stage_duration_seconds_count", (("stage", "enrich"),))] == 2
    assert (
        abs(values[("streamrank_stage_duration_seconds_sum", (("stage", "enrich"),))] - 0.003)
        < 1e-9
    )
    hits = (("kind", "user"), ("result", "hit"))
    assert values[("streamrank_feature_cache_requests_total", hits)] == 9
    assert values[("streamrank_feature_cache_hit_ratio", ())] == 9 / 12  # recomputed, not summed
    assert values[("streamrank_consumer_lag_messages", (("partition", "2"), ("topic", "in")))] == 10
    assert values[("streamrank_consumer_lag_messages", (("partition", "0"), ("topic", "in")))] == 2
    assert values[("streamrank_embedding_bytes", ())] == 1000
    assert values[("streamrank_rank_step_duration_seconds_count", (("rank", "0"),))] == 1
    assert text.count("# TYPE streamrank_consumed_messages_total counter") == 1  # one family each
    created = "streamrank_consumed_messages_created"
    sources = [rank, *workers]
    earliest = min(_samples(generate_latest(m.registry).decode())[(created, ())] for m in sources)
    assert values[(created, ())] == earliest  # the earliest, not a sum of timestamps


def test_a_stopped_workers_last_figures_stay() -> None:
    rank, worker = Metrics(), Metrics()
    merged = MergedMetrics(rank.registry)
    worker.events_in.inc(7)
    merged.update(0, snapshot(worker.registry))
    worker.events_in.inc(100)  # never reported: the worker stopped
    text = generate_latest(merged.registry).decode()
    assert _samples(text)[("streamrank_consumed_messages_total", ())] == 7
