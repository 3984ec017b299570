"""Fakes of the Kafka clients for stage and loop unit tests (integration tests use the broker).

They stand for librdkafka's clients behind the Kafka edge (:class:`~pipeline.connectors.kafka.
consumer.RawConsumer`, :class:`~pipeline.connectors.kafka.producer.RawProducer`) and nothing
more: a consumer that serves a scripted list of messages and records commits, a producer that
records what it was given and fires delivery callbacks when told (or on poll/flush, like
librdkafka). Tests hand them to the stages through the edge (:func:`edge_consumer`,
:func:`edge_producer`), as :func:`pipeline.connectors.kafka.clients.connect` does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, Message, TopicPartition

from pipeline.connectors.kafka.consumer import InputConsumer, RebalanceCallback
from pipeline.connectors.kafka.producer import DeliveryCallback, OutputProducer
from pipeline.runtime.backpressure import BackpressuredProducer
from pipeline.runtime.pausing import InputPause
from pipeline.stages.source import KafkaSource
from pipeline.types import Headers, PolledBatch, Shutdown


def FakeMessage(
    _topic: str,
    _value: bytes | None = None,
    _partition: int = 0,
    _offset: int = 0,
    _key: bytes | None = None,
    _headers: Headers | None = None,
    _error: KafkaError | None = None,
    _timestamp: tuple[int, int] = (TIMESTAMP_NOT_AVAILABLE, 0),
) -> Message:
    """A consumed (or produced) message: a real ``confluent_kafka.Message``, as the client
    makes them (the edge reads its columns with the client's own accessors)."""
    return Message(
        topic=_topic,
        value=_value,
        partition=_partition,
        offset=_offset,
        key=_key,
        headers=_headers,
        error=_error,
        timestamp=_timestamp,
    )


def polled(messages: list[Message]) -> PolledBatch:
    """``messages`` (of one topic) as the Kafka edge hands them on."""
    consumer = InputConsumer(FakeConsumer(messages=deque(messages)))
    consumer.topic = messages[0].topic() if messages else ""
    return consumer.consume(len(messages), 0)


def edge_consumer(consumer: FakeConsumer) -> InputConsumer:
    """The fake consumer behind the Kafka edge."""
    return InputConsumer(consumer)


def edge_producer(producer: FakeProducer) -> OutputProducer:
    """The fake producer behind the Kafka edge."""
    return OutputProducer(producer)


def sender(producer: FakeProducer) -> BackpressuredProducer:
    """The fake producer as the sinks are given it: behind the Kafka edge and the loop's
    backpressure (a full queue waits, as in the loop)."""
    source = KafkaSource(edge_consumer(FakeConsumer()), "in", 1)
    return BackpressuredProducer(edge_producer(producer), InputPause(source), Shutdown(10.0))


@dataclass
class FakeConsumer:
    """Serves ``messages`` in order from :meth:`consume`; assigns ``partitions`` on the first
    call (running ``on_assign`` inside consume, as librdkafka does)."""

    messages: deque[Message] = field(default_factory=deque)
    partitions: list[tuple[str, int]] = field(default_factory=list)
    commits: list[tuple[dict[tuple[str, int], int], bool]] = field(default_factory=list)
    callbacks: dict[str, RebalanceCallback] = field(default_factory=dict)
    closed: bool = False
    paused: list[list[tuple[str, int]]] = field(default_factory=list)
    resumed: list[list[tuple[str, int]]] = field(default_factory=list)
    seeks: list[tuple[str, int, int]] = field(default_factory=list)
    consume_calls: list[tuple[int, float]] = field(default_factory=list)
    """(num_messages, timeout) of every ``consume`` call."""
    _assigned: bool = False

    def subscribe(self, topics: list[str], **callbacks: RebalanceCallback) -> None:
        self.callbacks = callbacks

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        self.consume_calls.append((num_messages, timeout))
        if not self._assigned and "on_assign" in self.callbacks:
            self._assigned = True
            self.rebalance("on_assign", self.partitions)
        n = min(num_messages, len(self.messages))
        return [self.messages.popleft() for _ in range(n)]

    def rebalance(self, callback: str, partitions: list[tuple[str, int]]) -> None:
        """Run a rebalance callback (``on_assign``/``on_revoke``/``on_lost``) now."""
        self.callbacks[callback](self, [TopicPartition(t, p) for t, p in partitions])

    def commit(
        self,
        message: object = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> None:
        assert message is None
        assert offsets is not None
        for tp in offsets:
            assert isinstance(tp, TopicPartition)
        as_dict = {(tp.topic, tp.partition): tp.offset for tp in offsets}
        assert len(as_dict) == len(offsets), "one entry per partition"
        self.commits.append((as_dict, asynchronous))

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused.append([(tp.topic, tp.partition) for tp in partitions])

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.resumed.append([(tp.topic, tp.partition) for tp in partitions])

    def seek(self, partition: TopicPartition) -> None:
        self.seeks.append((partition.topic, partition.partition, partition.offset))

    def close(self) -> None:
        self.closed = True

    @property
    def offsets(self) -> list[dict[tuple[str, int], int]]:
        return [c[0] for c in self.commits]

    @property
    def committed(self) -> dict[tuple[str, int], int]:
        """The latest committed offset per partition."""
        out: dict[tuple[str, int], int] = {}
        for offsets in self.offsets:
            out.update(offsets)
        return out


class FakeProducer:
    """Records produced messages; delivery callbacks fire in :meth:`ack`, or in poll/flush.

    Args:
        acks_per_poll: callbacks fired by a ``poll`` with a positive timeout.
        stuck_on_flush: records that ``flush`` leaves undelivered.
        ack_every_poll: fire every pending callback on any ``poll``, even ``poll(0)``.
    """

    def __init__(
        self, acks_per_poll: int = 0, stuck_on_flush: int = 0, ack_every_poll: bool = False
    ) -> None:
        self.records: list[Message] = []
        self.pending: list[tuple[DeliveryCallback, KafkaError | None]] = []
        self.polls: list[float] = []
        self.flushes: list[float] = []
        self.acks_per_poll = acks_per_poll
        self.stuck_on_flush = stuck_on_flush
        self.ack_every_poll = ack_every_poll
        self.failures: deque[KafkaError] = deque()
        """Errors for the next produced records, in order."""

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        headers: Headers | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        self.records.append(FakeMessage(topic, value, _key=key, _headers=headers))
        if on_delivery is not None:
            error = self.failures.popleft() if self.failures else None
            self.pending.append((on_delivery, error))

    def on_topic(self, topic: str) -> list[Message]:
        return [r for r in self.records if r.topic() == topic]

    def ack(self, n: int | None = None) -> None:
        """Fire the oldest ``n`` (default all) delivery callbacks, like librdkafka's poll."""
        n = len(self.pending) if n is None else n
        fire, self.pending = self.pending[:n], self.pending[n:]
        for callback, error in fire:
            callback(error, FakeMessage("recs"))

    def poll(self, timeout: float = 0) -> int:
        self.polls.append(timeout)
        if self.ack_every_poll:
            n = len(self.pending)
        else:
            n = min(self.acks_per_poll, len(self.pending)) if timeout > 0 else 0
        self.ack(n)
        return n

    def flush(self, timeout: float = 0) -> int:
        self.flushes.append(timeout)
        self.ack(len(self.pending) - self.stuck_on_flush)
        return len(self.pending)
