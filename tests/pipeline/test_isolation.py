"""Poison isolation on fake Kafka clients: a batch that fails after decode is bisected, the
failing events are dead-lettered with ``processing_error``, the rest scored, all committed."""

from __future__ import annotations

from collections import deque

import pytest

from pipeline.config import BatchingSettings, MetricsSettings, Settings, TopicsSettings
from pipeline.faults import FAULTS_ENV_VAR, FaultInjector, InjectedFault
from pipeline.kafka_io import KafkaClients
from pipeline.loop import ScoringPipeline
from pipeline.stages.commit import DeliveryFailed
from pipeline.stages.decode import RECOMMENDATION_SCHEMA_FILE, RecordCodec
from pipeline.stages.isolate import bisect, is_isolatable
from pipeline.stages.publish import DETAIL_HEADER, REASON_HEADER
from pipeline.stepping import StepDecision
from tests.pipeline.factories import (
    DefaultsEnricher,
    encode_events,
    event_messages,
    tiny_scorer,
    user_event,
)
from tests.pipeline.fakes import FakeConsumer, FakeProducer

IN, OUT, DLQ = "in", "out", "dlq"


def _run(
    monkeypatch: pytest.MonkeyPatch, faults: str, overlap: bool, n: int = 24
) -> tuple[list[str], list[str], FakeProducer, FakeConsumer]:
    monkeypatch.setenv(FAULTS_ENV_VAR, faults)
    records = [user_event(candidates=3) for _ in range(n)]
    consumer = FakeConsumer(
        messages=deque(event_messages(IN, encode_events(records))), partitions=[(IN, 0)]
    )
    producer = FakeProducer(ack_every_poll=True)
    settings = Settings(
        topics=TopicsSettings(input=IN, output=OUT, dlq=DLQ),
        batching=BatchingSettings(max_batch_rows=1000, max_delay_ms=5, overlap_forward=overlap),
        metrics=MetricsSettings(enabled=False),
    )
    pipeline = ScoringPipeline(
        settings,
        tiny_scorer(),
        enricher=DefaultsEnricher(),
        clients=lambda kafka, topics, stats_cb: KafkaClients(consumer, producer),
    )
    pipeline.batcher.max_delay_s = 60  # one batch: the stop closes it
    pipeline.stop()
    pipeline.run()
    codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, OUT)
    scored = [codec.decode(r.value() or b"")["event_id"] for r in producer.on_topic(OUT)]
    return [r["event_id"] for r in records], scored, producer, consumer


@pytest.mark.parametrize("stage", ["features", "forward"])
@pytest.mark.parametrize("overlap", [False, True])
def test_the_poison_event_is_dead_lettered_and_the_rest_of_its_batch_scored(
    monkeypatch: pytest.MonkeyPatch, stage: str, overlap: bool
) -> None:
    monkeypatch.setattr("tests.pipeline.factories._event_ids", iter(range(10**6)))
    sent, scored, producer, consumer = _run(monkeypatch, f"{stage}:ev-7", overlap)
    assert "ev-7" in sent
    assert scored == [e for e in sent if e != "ev-7"]  # the rest, in order, once each
    (dead,) = producer.on_topic(DLQ)
    headers = dict(dead.headers() or [])
    assert headers[REASON_HEADER] == b"processing_error"
    assert f"injected {stage} failure for event ev-7".encode() in headers[DETAIL_HEADER]
    assert consumer.committed == {(IN, 0): len(sent)}


def test_two_poison_events_in_different_stages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.pipeline.factories._event_ids", iter(range(10**6)))
    sent, scored, producer, consumer = _run(monkeypatch, "features:ev-3,forward:ev-20", False)
    assert scored == [e for e in sent if e not in ("ev-3", "ev-20")]
    assert len(producer.on_topic(DLQ)) == 2
    assert consumer.committed == {(IN, 0): len(sent)}


def test_bisect_finds_each_failing_record_in_few_attempts() -> None:
    records = [{"event_id": str(i)} for i in range(64)]
    bad = {"5", "40"}

    def attempt(group: list[dict[str, str]]) -> int:
        if bad & {r["event_id"] for r in group}:
            raise ValueError("poison")
        return len(group)

    found = bisect(records, attempt, ValueError("poison"))
    assert {r["event_id"] for r, _ in found.failed} == bad
    assert [r["event_id"] for r in found.good_items] == [
        r["event_id"] for r in records if r["event_id"] not in bad
    ]
    assert sum(result for _, result in found.good) == 62
    assert found.attempts <= 4 * 6  # about 2 log2(64) per poison event


def test_an_outage_during_bisection_propagates() -> None:
    def attempt(group: list[dict[str, str]]) -> None:
        raise DeliveryFailed("broker down")

    with pytest.raises(DeliveryFailed):
        bisect([{"a": "1"}, {"a": "2"}], attempt, ValueError("x"))  # type: ignore[arg-type]
    assert not is_isolatable(OSError("redis"))
    assert is_isolatable(InjectedFault("x"))


def test_the_fault_hook_is_off_unless_asked_and_rejects_typos() -> None:
    assert FaultInjector.from_env({}) is None
    with pytest.raises(ValueError, match="unknown stage"):
        FaultInjector.from_env({FAULTS_ENV_VAR: "enrich:ev-1"})
    with pytest.raises(ValueError, match="stage:event_id"):
        FaultInjector.from_env({FAULTS_ENV_VAR: "features"})


class _RankStepper:
    """A one-rank stand-in for CollectiveStepper (the loop takes the multi-rank paths)."""

    poll_timeout_s = 0.01

    def agree(self, ready: bool, rows: int, stop_requested: bool, idle: bool) -> StepDecision:
        return StepDecision(run=ready or stop_requested, rows=rows, stop=stop_requested or idle)


def _run_as_rank(
    monkeypatch: pytest.MonkeyPatch, faults: str
) -> tuple[list[str], list[str], FakeProducer, FakeConsumer]:
    monkeypatch.setenv(FAULTS_ENV_VAR, faults)
    monkeypatch.setattr("tests.pipeline.factories._event_ids", iter(range(10**6)))
    records = [user_event(candidates=3) for _ in range(16)]
    consumer = FakeConsumer(
        messages=deque(event_messages(IN, encode_events(records))), partitions=[(IN, 0)]
    )
    producer = FakeProducer(ack_every_poll=True)
    pipeline = ScoringPipeline(
        Settings(
            topics=TopicsSettings(input=IN, output=OUT, dlq=DLQ),
            batching=BatchingSettings(max_batch_rows=1000, max_delay_ms=5),
            metrics=MetricsSettings(enabled=False),
        ),
        tiny_scorer(),
        enricher=DefaultsEnricher(),
        stepper=_RankStepper(),
        clients=lambda kafka, topics, stats_cb: KafkaClients(consumer, producer),
    )
    pipeline.batcher.max_delay_s = 60
    pipeline.stop()
    pipeline.run()
    codec = RecordCodec(Settings().codec, RECOMMENDATION_SCHEMA_FILE, OUT)
    scored = [codec.decode(r.value() or b"")["event_id"] for r in producer.on_topic(OUT)]
    return [r["event_id"] for r in records], scored, producer, consumer


def test_a_rank_isolates_failures_before_the_forward_and_joins_it_with_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent, scored, producer, consumer = _run_as_rank(monkeypatch, "features:ev-5")
    assert scored == [e for e in sent if e != "ev-5"]
    (dead,) = producer.on_topic(DLQ)
    assert dict(dead.headers() or [])[REASON_HEADER] == b"processing_error"
    assert consumer.committed == {(IN, 0): len(sent)}


def test_a_rank_lets_a_forward_failure_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InjectedFault):  # a collective forward cannot be retried by one rank
        _run_as_rank(monkeypatch, "forward:ev-5")
