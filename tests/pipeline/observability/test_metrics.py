"""Exported metric names, pre-created label values and the rank/step/collective recorders."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from confluent_kafka import KafkaError, TopicPartition

import model.serving.device
from model.rank import RankContext
from pipeline.connectors.kafka.consumer import CommitResults
from pipeline.observability.metrics import FALLBACK_FEATURES, STEP_AGREE, Metrics
from pipeline.runtime.stepping import LocalStep, ProcessGroup, StepAgreement
from pipeline.stages.commit import Checkpointer
from pipeline.types import FallbackFeature, RejectReason
from tests.pipeline.fakes import FakeConsumer, FakeProducer, edge_consumer, edge_producer

EXPORTED = {
    "streamrank_consumed_messages_total",
    "streamrank_produced_recommendations_total",
    "streamrank_dead_letter_messages_total",
    "streamrank_batch_rows",
    "streamrank_stage_duration_seconds",
    "streamrank_end_to_end_latency_seconds",
    "streamrank_feature_cache_requests_total",
    "streamrank_feature_cache_hit_ratio",
    "streamrank_feature_fallback_events_total",
    "streamrank_retrieved_events_total",
    "streamrank_embedding_bytes",
    "streamrank_consumer_lag_messages",
    "streamrank_commit_failures_total",
    "streamrank_rank_step_duration_seconds",
    "streamrank_collective_duration_seconds",
    "streamrank_rank_up",
    "streamrank_world_size",
    "streamrank_degradations",
    "streamrank_model_info",
    "streamrank_model_swaps_total",
    "streamrank_model_load_failures_total",
    "streamrank_model_load_seconds",
}


def _sample_names(metrics: Metrics) -> set[str]:
    names = set()
    for family in metrics.registry.collect():
        for sample in family.samples:
            name = sample.name
            if name.endswith("_created"):  # creation timestamps of counters and histograms
                continue
            for suffix in ("_bucket", "_count", "_sum"):
                name = name.removesuffix(suffix)
            names.add(name)
    return names


def test_exported_names_follow_the_conventions() -> None:
    metrics = Metrics()
    metrics.consumer_lag.labels(topic="t", partition="0").set(3)
    metrics.record_cache("user", hits=1, misses=0)
    metrics.record_step(0.01)
    metrics.record_collective(STEP_AGREE, 0.001)
    metrics.set_up(True)
    assert _sample_names(metrics) == EXPORTED


def test_known_label_values_exist_at_zero_before_any_event() -> None:
    metrics = Metrics()
    get = metrics.registry.get_sample_value
    for reason in RejectReason:
        assert get("streamrank_dead_letter_messages_total", {"reason": reason.value}) == 0
    for feature in FALLBACK_FEATURES:
        assert get("streamrank_feature_fallback_events_total", {"feature": feature}) == 0
    assert set(FALLBACK_FEATURES) == {f.value for f in FallbackFeature}


def test_commit_failures_are_exported_from_the_committers_count() -> None:
    metrics = Metrics()
    get = metrics.registry.get_sample_value
    assert get("streamrank_commit_failures_total") == 0  # before any committer exists
    results = CommitResults()
    first = Checkpointer(
        edge_consumer(FakeConsumer()), edge_producer(FakeProducer()), commit_results=results
    )
    metrics.commit_failures.watch(lambda: first.commit_failures)
    timed_out = KafkaError(KafkaError.REQUEST_TIMED_OUT)
    results(timed_out, [TopicPartition("events", 0, 5)])
    results(timed_out, [TopicPartition("events", 1, 3)])
    assert first.commit_failures == 2
    assert get("streamrank_commit_failures_total") == 2
    # A new run of the loop builds a new committer: the counter keeps the earlier failures.
    results = CommitResults()
    second = Checkpointer(
        edge_consumer(FakeConsumer()), edge_producer(FakeProducer()), commit_results=results
    )
    metrics.commit_failures.watch(lambda: second.commit_failures)
    assert get("streamrank_commit_failures_total") == 2
    results(timed_out, [TopicPartition("events", 0, 9)])
    assert get("streamrank_commit_failures_total") == 3


def test_rank_and_world_size_come_from_the_rank_context() -> None:
    metrics = Metrics(rank=RankContext(rank=3, world_size=4), degradations=2)
    metrics.record_step(0.02)
    get = metrics.registry.get_sample_value
    assert get("streamrank_world_size") == 4
    assert get("streamrank_degradations") == 2
    assert Metrics().registry.get_sample_value("streamrank_degradations") == 0
    assert get("streamrank_rank_step_duration_seconds_count", {"rank": "3"}) == 1
    assert get("streamrank_rank_step_duration_seconds_sum", {"rank": "3"}) == pytest.approx(0.02)
    metrics.set_up(False)
    assert get("streamrank_rank_up", {"rank": "3"}) == 0


def test_no_gpu_series_without_cuda() -> None:
    assert not any(n.startswith("streamrank_gpu_") for n in _sample_names(Metrics()))


def test_gpu_series_describe_the_gpu_the_rank_serves_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # LOCAL_RANK says 0, but this process serves on cuda:1 (model.device bound it): the
    # scrape reads cuda:1, whatever the scrape thread's own current device is.
    asked: list[object] = []

    def per_device(value: int) -> Callable[[object], int]:
        def read(device: object) -> int:
            asked.append(device)
            return value

        return read

    def no_nvml(device: object) -> int:
        raise RuntimeError("pynvml not installed")

    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(model.serving.device, "_bound", [torch.device("cuda", 1)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", per_device(3))
    monkeypatch.setattr(torch.cuda, "memory_reserved", per_device(5))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: asked.append(device) or SimpleNamespace(total_memory=7),
    )
    monkeypatch.setattr(torch.cuda, "utilization", no_nvml)
    registry = Metrics().registry
    for kind, value in (("allocated", 3), ("reserved", 5), ("total", 7)):
        labels = {"rank": "0", "kind": kind}
        assert registry.get_sample_value("streamrank_gpu_memory_bytes", labels) == value
    assert asked and set(asked) == {torch.device("cuda", 1)}
    monkeypatch.setattr(model.serving.device, "_bound", [])  # CUDA up but no GPU bound: no series
    assert not any(n.startswith("streamrank_gpu_") for n in _sample_names(Metrics()))


def test_serve_marks_the_rank_up_and_exposes_the_registry() -> None:
    metrics = Metrics()
    port = metrics.serve("127.0.0.1", 0)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'streamrank_rank_up{rank="0"} 1.0' in body
    assert "streamrank_consumed_messages_total 0.0" in body


@pytest.fixture
def single_rank_group() -> Iterator[None]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_collective_stepper_records_collective_latency_and_step_time(
    single_rank_group: None,
) -> None:
    metrics = Metrics()
    stepper = StepAgreement(ProcessGroup(), metrics)
    get = metrics.registry.get_sample_value
    labels = {"rank": "0", "op": STEP_AGREE}
    assert stepper.agree(LocalStep(ready=True, rows=8, stop_requested=False, idle=False)).run
    assert get("streamrank_collective_duration_seconds_count", labels) == 1
    assert get("streamrank_rank_step_duration_seconds_count", {"rank": "0"}) is None
    # The next agreement closes the step started by the run decision...
    assert not stepper.agree(LocalStep(ready=False, rows=0, stop_requested=False, idle=False)).run
    assert get("streamrank_rank_step_duration_seconds_count", {"rank": "0"}) == 1
    # ...and one after a no-run decision records no step.
    stepper.agree(LocalStep(ready=False, rows=0, stop_requested=False, idle=False))
    assert get("streamrank_rank_step_duration_seconds_count", {"rank": "0"}) == 1
    assert get("streamrank_collective_duration_seconds_count", labels) == 3
