"""Exported metric names, pre-created label values and the rank/step/collective recorders."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from pipeline.metrics import FALLBACK_FEATURES, STEP_AGREE, Metrics
from pipeline.stages.decode import RejectReason
from pipeline.stages.enrich import FallbackFeature
from pipeline.stepping import CollectiveStepper

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
    "streamrank_embedding_bytes",
    "streamrank_consumer_lag_messages",
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


def test_rank_and_world_size_come_from_torchrun_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("STREAMRANK_DEGRADATIONS", "2")
    metrics = Metrics()
    metrics.record_step(0.02)
    get = metrics.registry.get_sample_value
    assert get("streamrank_world_size") == 4
    assert get("streamrank_degradations") == 2
    monkeypatch.delenv("STREAMRANK_DEGRADATIONS")
    assert Metrics().registry.get_sample_value("streamrank_degradations") == 0
    assert get("streamrank_rank_step_duration_seconds_count", {"rank": "3"}) == 1
    assert get("streamrank_rank_step_duration_seconds_sum", {"rank": "3"}) == pytest.approx(0.02)
    metrics.set_up(False)
    assert get("streamrank_rank_up", {"rank": "3"}) == 0


def test_no_gpu_series_without_cuda() -> None:
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
    stepper = CollectiveStepper(metrics=metrics)
    get = metrics.registry.get_sample_value
    labels = {"rank": "0", "op": STEP_AGREE}
    assert stepper.agree(ready=True, rows=8, stop_requested=False, idle=False).run
    assert get("streamrank_collective_duration_seconds_count", labels) == 1
    assert get("streamrank_rank_step_duration_seconds_count", {"rank": "0"}) is None
    # The next agreement closes the step started by the run decision...
    assert not stepper.agree(ready=False, rows=0, stop_requested=False, idle=False).run
    assert get("streamrank_rank_step_duration_seconds_count", {"rank": "0"}) == 1
    # ...and one after a no-run decision records no step.
    stepper.agree(ready=False, rows=0, stop_requested=False, idle=False)
    assert get("streamrank_rank_step_duration_seconds_count", {"rank": "0"}) == 1
    assert get("streamrank_collective_duration_seconds_count", labels) == 3
