"""A loop's drain and rebalance handler on fake Kafka clients, with an open batch of four
events on two partitions (offsets 0 and 1 of each), for the rebalance and drain tests."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline.connectors.kafka.consumer import CommitResults
from pipeline.observability.metrics import Metrics
from pipeline.observability.summary import RunSummary
from pipeline.runtime.backpressure import BackpressuredProducer
from pipeline.runtime.drain import Drain
from pipeline.runtime.pausing import InputPause
from pipeline.runtime.processor import BatchProcessor
from pipeline.runtime.rebalance import RebalanceHandler
from pipeline.runtime.stepping import Alone, ProcessGroup, StepAgreement, Stepper
from pipeline.stages.batch import MicroBatcher
from pipeline.stages.commit import Checkpointer
from pipeline.stages.dead_letter import DeadLetterSink
from pipeline.stages.publish import RecommendationSink
from pipeline.stages.score import ForwardExecutor
from pipeline.stages.source import KafkaSource
from pipeline.types import Shutdown
from tests.pipeline.factories import DefaultsEnricher, columns, tiny_scorer, user_event
from tests.pipeline.fakes import (
    FakeConsumer,
    FakeMessage,
    FakeProducer,
    edge_consumer,
    edge_producer,
    polled,
)

T = "in"


class GroupConsumer(FakeConsumer):
    """A member of a consumer group whose commits the group answers at the member's next
    ``consume`` (the commit result callback, as librdkafka calls it from a poll).

    While ``busy`` is positive (one less per blocking ``consume``: the group moves on while the
    member polls), the group refuses commits with ``error``: a synchronous one raises it, an
    asynchronous one is answered with it.
    """

    def __init__(self, busy: int = 0, error: int = KafkaError.REBALANCE_IN_PROGRESS) -> None:
        super().__init__()
        self.busy = busy
        self.error = error
        self.attempts = 0
        self.results = CommitResults()
        self._unanswered: list[tuple[KafkaError | None, list[TopicPartition]]] = []

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        if timeout > 0:
            self.busy -= 1
        answered, self._unanswered = self._unanswered, []
        for error, offsets in answered:
            self.results(error, offsets)
        return super().consume(num_messages, timeout)

    def commit(
        self,
        message: object = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> Any:
        self.attempts += 1
        refusal = KafkaError(self.error) if self.busy > 0 else None
        if refusal is not None and not asynchronous:
            raise KafkaException(refusal)
        if refusal is None:
            super().commit(message, offsets, asynchronous)
        if asynchronous:
            self._unanswered.append((refusal, list(offsets or [])))
            return None
        return [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in offsets or []]


@dataclass
class Rig:
    handler: RebalanceHandler
    drain: Drain
    batcher: MicroBatcher
    checkpointer: Checkpointer
    source: KafkaSource
    consumer: GroupConsumer
    producer: FakeProducer


def rig(
    collective: bool = False,
    consumer: GroupConsumer | None = None,
    stepper: Stepper | None = None,
    shutdown: Shutdown | None = None,
) -> Rig:
    """The drain of one member (a rank of a sharded model with ``collective``), assigned
    partitions 0 and 1 of :data:`T`, its open batch holding offsets 0 and 1 of each."""
    consumer = consumer or GroupConsumer()
    consumer.messages = deque([FakeMessage(T, b"x", 1, 7), FakeMessage(T, b"y", 0, 3)])
    producer = FakeProducer(ack_every_poll=True)
    input_consumer, output_producer = edge_consumer(consumer), edge_producer(producer)
    source = KafkaSource(input_consumer, T, 10)
    batcher = MicroBatcher(max_batch_rows=100, max_delay_ms=1000)
    checkpointer = Checkpointer(input_consumer, output_producer, commit_results=consumer.results)
    metrics = Metrics()
    shutdown = shutdown or Shutdown(10.0)
    pause = InputPause(source)
    wrapped = BackpressuredProducer(output_producer, pause, shutdown)
    processor = BatchProcessor(
        DefaultsEnricher(),
        ForwardExecutor(tiny_scorer(), metrics),
        RecommendationSink(wrapped, "out", b"", metrics),
        DeadLetterSink(wrapped, "dlq", metrics),
        metrics,
        RunSummary(),
        collective=collective,
    )
    stepper = stepper or StepAgreement(ProcessGroup() if collective else Alone())
    drain = Drain(batcher, checkpointer, processor, source, wrapped, pause, stepper, shutdown)
    handler = RebalanceHandler(source, drain)
    handler.on_assign({(T, 0), (T, 1)})
    source.poll(0.0)
    for partition, offset in ((0, 0), (1, 0), (0, 1), (1, 1)):
        checkpointer.consumed(T, np.array([partition]), np.array([offset]))
        batcher.add(columns([user_event()]), polled([FakeMessage(T, b"", partition, offset)]))
    return Rig(handler, drain, batcher, checkpointer, source, consumer, producer)
