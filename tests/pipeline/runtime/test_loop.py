"""The whole scoring loop on fake Kafka clients: every stage wired, nothing lost, commits last.

The same behaviours are checked against the real broker and Redis in tests/integration; here
the clients are fakes so that each path (DLQ, held events, revocation, stop) is exact.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from pipeline.runtime.loop import ScoringPipeline
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.loading import Settings
from tests.pipeline.factories import (
    DefaultsEnricher,
    encode_events,
    event_messages,
    user_event,
)
from tests.pipeline.fakes import FakeConsumer, FakeMessage, FakeProducer
from tests.pipeline.runtime.loops import DLQ, IN, OUT, fake_loop, loop_settings, published_event_ids


def _settings(max_batch_rows: int = 64, overlap: bool = False) -> Settings:
    return loop_settings(
        BatchingSettings(max_batch_rows=max_batch_rows, max_delay_ms=5, overlap_forward=overlap)
    )


def _pipeline(
    messages: list[FakeMessage], partitions: list[tuple[str, int]], **settings: Any
) -> tuple[ScoringPipeline, FakeConsumer, FakeProducer, DefaultsEnricher]:
    consumer = FakeConsumer(messages=deque(messages), partitions=partitions)
    producer = FakeProducer(ack_every_poll=True)
    enricher = DefaultsEnricher()
    pipeline = fake_loop(_settings(**settings), consumer, producer, enricher=enricher)
    return pipeline, consumer, producer, enricher


def _event_ids(producer: FakeProducer) -> list[str]:
    return published_event_ids(_settings(), producer)


def test_every_event_scored_once_rejects_dead_lettered_and_all_offsets_committed() -> None:
    records = [user_event(candidates=5 + i % 7) for i in range(40)]
    values = encode_events(records)
    values[10] = b"\x00garbage"
    values[25] = None
    pipeline, consumer, producer, enricher = _pipeline(
        event_messages(IN, values), [(IN, 0)], max_batch_rows=32
    )
    summary = pipeline.run(exit_when_idle_s=0.05)

    expected = [r["event_id"] for i, r in enumerate(records) if i not in (10, 25)]
    assert _event_ids(producer) == expected  # in order, once each
    assert len(producer.on_topic(DLQ)) == 2
    assert summary.events_in == 40 and summary.events_out == 38 and summary.dead_lettered == 2
    assert summary.batches == enricher.calls > 1  # several batches, one enrichment each
    budget = pipeline.policy.budget  # every batch closed by the loop charged to its budget
    assert (budget.batches, budget.unmatched) == (summary.batches, 0)
    assert consumer.committed == {(IN, 0): 40}
    assert consumer.closed
    steps = pipeline.metrics.registry.get_sample_value(
        "streamrank_rank_step_duration_seconds_count", {"rank": "0"}
    )
    assert steps is not None and steps >= summary.batches - 1


def test_an_event_that_does_not_fit_opens_the_next_batch() -> None:
    records = [user_event(candidates=20) for _ in range(3)]
    pipeline, consumer, producer, _ = _pipeline(
        event_messages(IN, encode_events(records)), [(IN, 0)], max_batch_rows=30
    )
    summary = pipeline.run(exit_when_idle_s=0.05)
    assert summary.batches == 3
    assert summary.rows_scored == 60
    assert _event_ids(producer) == [r["event_id"] for r in records]
    assert consumer.committed == {(IN, 0): 3}


def test_stop_scores_the_open_batch_and_commits() -> None:
    records = [user_event() for _ in range(5)]
    pipeline, consumer, _, _ = _pipeline(
        event_messages(IN, encode_events(records)), [(IN, 0)], max_batch_rows=1000
    )
    pipeline.stop()
    summary = pipeline.run()
    assert summary.events_out == summary.events_in
    assert consumer.committed == {(IN, 0): summary.events_in}


def test_revocation_mid_stream_hands_over_with_nothing_uncommitted_or_repeated() -> None:
    records = [user_event() for _ in range(12)]
    values = encode_events(records)
    messages = event_messages(IN, values[:6], partition=0) + event_messages(
        IN, values[6:], partition=1
    )
    pipeline, consumer, producer, _ = _pipeline(
        messages, [(IN, 0), (IN, 1)], max_batch_rows=1000, overlap=True
    )
    consumer.messages = deque(messages[:8])  # partition 0 and two of partition 1 first
    pipeline.batcher.max_delay_s = 60  # nothing closes on time: the revocation must score

    original_consume = consumer.consume

    def consume_then_revoke(num_messages: int = 1, timeout: float = -1) -> list[Any]:
        got = original_consume(num_messages, timeout)
        if not got and not consumer.messages and pipeline.summary.events_in == 8:
            consumer.rebalance("on_revoke", [(IN, 1)])
            pipeline.stop()
        return got

    consumer.consume = consume_then_revoke  # type: ignore[method-assign]
    pipeline.run()
    assert _event_ids(producer) == [r["event_id"] for r in records[:8]]
    assert consumer.committed == {(IN, 0): 6, (IN, 1): 2}
    assert pipeline.assignment == {(IN, 0)}


def test_a_free_scorer_scores_the_drained_input_without_waiting_out_max_delay() -> None:
    records = [user_event() for _ in range(3)]
    consumer = FakeConsumer(messages=deque(event_messages(IN, encode_events(records))))
    consumer.partitions = [(IN, 0)]
    producer = FakeProducer(ack_every_poll=True)
    settings = loop_settings(BatchingSettings(max_delay_ms=60_000, latency_budget_ms=60_000))
    pipeline = fake_loop(settings, consumer, producer)
    polls_until_scored: list[int] = []
    serve = consumer.consume

    def consume(num_messages: int = 1, timeout: float = -1) -> list[Any]:
        done = producer.on_topic(OUT) or len(consumer.consume_calls) > 2000
        if done and not polls_until_scored:
            polls_until_scored.append(len(consumer.consume_calls))
            pipeline.stop()
        time.sleep(min(max(timeout, 0.0), 0.005))  # blocks like the client (shorter)
        return serve(num_messages, timeout)

    consumer.consume = consume  # type: ignore[method-assign]
    summary = pipeline.run()
    assert summary.events_out == 3 and summary.batches == 1
    assert polls_until_scored and polls_until_scored[0] < 2000, "waited for the stop"
