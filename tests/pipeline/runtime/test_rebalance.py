"""Rebalance handling for a single process and for a rank of a sharded model."""

from __future__ import annotations

from collections import deque

import numpy as np
from confluent_kafka import TopicPartition

from pipeline.observability.metrics import Metrics
from pipeline.observability.summary import RunSummary
from pipeline.runtime.drain import Drain
from pipeline.runtime.processor import BatchProcessor
from pipeline.runtime.rebalance import RebalanceHandler
from pipeline.stages.batch import MicroBatcher
from pipeline.stages.commit import Checkpointer
from pipeline.stages.dead_letter import DeadLetterSink
from pipeline.stages.publish import RecommendationSink
from pipeline.stages.score import ForwardExecutor
from pipeline.stages.source import KafkaSource
from tests.pipeline.factories import DefaultsEnricher, columns, tiny_scorer, user_event
from tests.pipeline.fakes import FakeConsumer, FakeMessage, FakeProducer

T = "in"


def _handler(
    collective: bool,
) -> tuple[RebalanceHandler, Drain, MicroBatcher, Checkpointer, FakeConsumer, FakeProducer]:
    consumer = FakeConsumer(
        messages=deque([FakeMessage(T, b"x", 1, 7), FakeMessage(T, b"y", 0, 3)])
    )
    producer = FakeProducer(ack_every_poll=True)
    source = KafkaSource(consumer, T, 10)
    batcher = MicroBatcher(max_rows=100, max_delay_ms=1000)
    checkpointer = Checkpointer(consumer, producer)
    metrics = Metrics()
    processor = BatchProcessor(
        DefaultsEnricher(),
        ForwardExecutor(tiny_scorer(), metrics),
        RecommendationSink(producer, "out", b"", metrics),
        DeadLetterSink(producer, "dlq", metrics),
        metrics,
        RunSummary(),
        collective=collective,
    )
    drain = Drain(batcher, checkpointer, processor, collective, timeout_s=10.0)
    handler = RebalanceHandler(source, drain)
    handler.on_assign(consumer, [TopicPartition(T, 0), TopicPartition(T, 1)])
    source.poll(0.0)
    for partition, offset in ((0, 0), (1, 0), (0, 1), (1, 1)):
        checkpointer.consumed(T, np.array([partition]), np.array([offset]))
        batcher.add(columns([user_event()]), [FakeMessage(T, b"", partition, offset)])
    return handler, drain, batcher, checkpointer, consumer, producer


def test_single_process_scores_its_open_batch_then_commits_synchronously() -> None:
    handler, _, batcher, _, consumer, producer = _handler(collective=False)
    handler.on_revoke(consumer, [TopicPartition(T, 1)])
    assert len(producer.on_topic("out")) == 4  # the open batch was scored, then handed over
    assert len(batcher) == 0
    assert consumer.commits[-1] == ({(T, 0): 2, (T, 1): 2}, False)


def test_rank_drops_revoked_events_and_commits_only_what_was_delivered() -> None:
    handler, _, batcher, checkpointer, consumer, producer = _handler(collective=True)
    handler.on_revoke(consumer, [TopicPartition(T, 1)])
    assert producer.on_topic("out") == []  # a rank never runs a forward alone
    assert len(batcher) == 2
    assert checkpointer.open.next_offsets == {(T, 0): 2}
    assert consumer.commits == []  # nothing delivered yet, nothing committed


def test_after_a_failure_a_revocation_scores_and_commits_nothing() -> None:
    handler, drain, _, _, consumer, producer = _handler(collective=False)
    drain.failed = True
    handler.on_revoke(consumer, [TopicPartition(T, 0), TopicPartition(T, 1)])
    assert producer.on_topic("out") == [] and consumer.commits == []


def test_lost_partitions_are_forgotten() -> None:
    handler, _, _, checkpointer, consumer, _ = _handler(collective=False)
    handler.on_lost(consumer, [TopicPartition(T, 0)])
    assert checkpointer.open.next_offsets == {(T, 1): 2}
