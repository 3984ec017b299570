"""The consumer at the edge: each poll becomes one :class:`~pipeline.types.PolledBatch`, and the
group's callbacks, commits and results speak streamrank's own types.

:class:`InputConsumer` wraps librdkafka's consumer (``confluent_kafka.Consumer``, or a fake of
it in unit tests: :class:`RawConsumer`). Nothing behind it sees a client type:

- :meth:`InputConsumer.consume` turns the messages of a poll into columns in one pass (values,
  keys, partitions, offsets, timestamps, headers) and drops the client's message objects;
  messages that carry a client error are left out there (the end of a partition is not an
  error; a fatal error raises :class:`~pipeline.connectors.kafka.errors.KafkaClientError`;
  anything else is logged), and so are messages of partitions no longer assigned;
- the rebalance callbacks receive sets of ``(topic, partition)``;
- commits take ``{(topic, partition): offset}``; their results (:class:`CommitResults`, the
  consumer's ``on_commit``) come back as such dicts with :class:`KafkaClientError` per failure.

Example::

    consumer = InputConsumer(make_consumer(settings.kafka.config))
    consumer.subscribe("user-events", on_assign, on_revoke, on_lost)
    polled = consumer.consume(500, timeout_s=0.1)   # a PolledBatch, empty when nothing came
    consumer.commit({("user-events", 0): 42})
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any, Literal, Protocol, cast, overload

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from pipeline.connectors.kafka.errors import KafkaClientError, client_call
from pipeline.types import Headers, Partition, PolledBatch

__all__ = [
    "CommitListener",
    "CommitResults",
    "InputConsumer",
    "PartitionsCallback",
    "RawConsumer",
    "RebalanceCallback",
]

log = logging.getLogger(__name__)

RebalanceCallback = Callable[[Any, list[TopicPartition]], None]
"""librdkafka's ``on_assign``/``on_revoke``/``on_lost``: (consumer, partitions)."""

PartitionsCallback = Callable[[set[Partition]], None]
"""A rebalance callback as the pipeline takes it: the partitions assigned, revoked or lost."""

CommitListener = Callable[
    [KafkaClientError | None, dict[Partition, int], dict[Partition, KafkaClientError]], None
]
"""A commit's result: the error of the whole commit (``None``: none), the offsets it was for,
and the error of each partition whose offset failed."""


class RawConsumer(Protocol):
    """What the edge calls of librdkafka's consumer (``confluent_kafka.Consumer``)."""

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback = ...,
        on_revoke: RebalanceCallback = ...,
        on_lost: RebalanceCallback = ...,
    ) -> None: ...

    def consume(self, num_messages: int = ..., timeout: float = ...) -> list[Message]: ...

    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[True] = ...
    ) -> None: ...

    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...

    def pause(self, partitions: list[TopicPartition]) -> None: ...

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def seek(self, partition: TopicPartition) -> None: ...

    def consumer_group_metadata(self) -> object: ...

    def close(self) -> None: ...


def _partitions(partitions: list[TopicPartition]) -> set[Partition]:
    return {(tp.topic, tp.partition) for tp in partitions}


def _topic_partitions(offsets: dict[Partition, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p, o) for (t, p), o in offsets.items()]


def _partition_errors(partitions: list[TopicPartition]) -> dict[Partition, KafkaClientError]:
    return {
        (tp.topic, tp.partition): KafkaClientError.of(tp.error) for tp in partitions if tp.error
    }


class CommitResults:
    """The consumer's ``on_commit``, forwarding each commit result to :attr:`listener` in the
    pipeline's types (see :data:`CommitListener`).

    The consumer is configured before the commit protocol exists; the protocol sets
    ``listener`` when it is built.

    Example::

        results = CommitResults()
        consumer = make_consumer(settings.kafka.config, extra={"on_commit": results})
        results.listener = checkpointer.on_commit
    """

    def __init__(self) -> None:
        self.listener: CommitListener | None = None

    def __call__(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if self.listener is None:
            return
        offsets = {(tp.topic, tp.partition): tp.offset for tp in partitions}
        error = KafkaClientError.of(err) if err is not None else None
        self.listener(error, offsets, _partition_errors(partitions) if error is None else {})


_value = Message.value
_key = Message.key
_error = Message.error
_partition = Message.partition
_offset = Message.offset
_headers = Message.headers
_timestamp = Message.timestamp
_second = itemgetter(1)


def polled_batch(topic: str, messages: list[Message]) -> PolledBatch:
    """``messages`` (of ``topic``, without client errors) as columns: one pass per column with
    the client's own accessors, no Python object per message of ours.

    Raises:
        TypeError: an element is not a ``confluent_kafka.Message`` (fakes build real ones).
    """
    n = len(messages)
    values = list(map(_value, messages))
    lengths = np.fromiter(map(len, messages), np.int64, n)
    if values.count(None) != 0:
        lengths[[i for i, v in enumerate(values) if v is None]] = -1
    stamps = np.fromiter(map(_second, map(_timestamp, messages)), np.int64, n)
    stamps[stamps <= 0] = -1  # TIMESTAMP_NOT_AVAILABLE (or a producer that set none)
    return PolledBatch(
        topic,
        values,
        lengths,
        list(map(_key, messages)),
        np.fromiter(map(_partition, messages), np.int64, n),
        np.fromiter(map(_offset, messages), np.int64, n),
        stamps,
        # librdkafka gives a list of (name, value) pairs or None (the stubs also allow a dict)
        cast("list[Headers | None]", list(map(_headers, messages))),
    )


class InputConsumer:
    """The input topic's consumer as the pipeline sees it (see the module docstring).

    Args:
        consumer: librdkafka's consumer (or a fake of it); closed by :meth:`close`.
    """

    def __init__(self, consumer: RawConsumer) -> None:
        self._consumer = consumer
        self.topic = ""
        """The subscribed topic (set by :meth:`subscribe`)."""
        self._gone: set[Partition] = set()
        """Partitions revoked or lost and not assigned again since (their messages are dropped:
        :meth:`consume`)."""

    def subscribe(
        self,
        topic: str,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None:
        """Join the consumer group on ``topic``; the callbacks run inside :meth:`consume`
        (librdkafka hands revoked partitions over when the callback returns)."""
        self.topic = topic
        self._consumer.subscribe(
            [topic],
            on_assign=lambda _, tps: on_assign(self._owned(_partitions(tps), gone=False)),
            on_revoke=lambda _, tps: on_revoke(self._owned(_partitions(tps), gone=True)),
            on_lost=lambda _, tps: on_lost(self._owned(_partitions(tps), gone=True)),
        )

    def _owned(self, partitions: set[Partition], gone: bool) -> set[Partition]:
        """Note ``partitions`` as taken away (``gone``) or assigned; returns them."""
        if gone:
            self._gone |= partitions
        else:
            self._gone -= partitions
        return partitions

    def consume(self, limit: int, timeout_s: float) -> PolledBatch:
        """What is queued in the client, up to ``limit`` messages; blocks (at most
        ``timeout_s``) only when nothing is queued (rebalance callbacks run in here).

        ``consume(n, timeout)`` returns only when ``n`` messages arrived or the timeout passed,
        even with messages queued; so the queue is drained without blocking first, and the
        blocking call asks for one message, which returns as soon as one arrives (then what
        came with it is drained too).

        Messages of a partition revoked or lost (and not assigned again) are dropped: a batch
        can still hold messages fetched before the revocation, served after its callback
        (confluent-kafka-python#1013; seen here after a cooperative revocation). Their next
        owner consumes them from the committed offset; scored here, they would be published
        twice, and their commit could move the new owner's offsets back.

        Returns:
            The messages as columns (empty when none came); messages that carried a client
            error are not among them, nor messages of partitions this member does not own.

        Raises:
            KafkaClientError: the client failed, or a message carried a fatal error.
        """
        consumer = self._consumer
        try:
            messages = consumer.consume(limit, 0)
            if not messages and timeout_s > 0:
                messages = consumer.consume(1, timeout_s)
                if messages and limit > 1:
                    messages.extend(consumer.consume(limit - 1, 0))
        except KafkaException as exc:
            raise KafkaClientError.of(exc) from exc
        if not messages:
            return PolledBatch.empty(self.topic)
        errors = list(map(_error, messages))
        if any(errors):  # a KafkaError is true (comparing one with None raises)
            messages = self._without_errors(messages, errors)
            if not messages:
                return PolledBatch.empty(self.topic)
        polled = polled_batch(messages[0].topic() or self.topic, messages)
        return self._without_gone(polled) if self._gone else polled

    def _without_gone(self, polled: PolledBatch) -> PolledBatch:
        """``polled`` without the messages of partitions revoked or lost (see :meth:`consume`)."""
        stale = polled.in_partitions(self._gone)
        if not stale.any():
            return polled
        log.info(
            "dropped %d polled messages of partitions no longer assigned (fetched before their "
            "revocation; their next owner consumes them)",
            int(stale.sum()),
        )
        return polled.where(~stale)

    @staticmethod
    def _without_errors(messages: list[Message], errors: list[KafkaError | None]) -> list[Message]:
        """The messages that carry data; client errors are skipped (the end of a partition),
        logged, or raised (fatal)."""
        kept = []
        for message, err in zip(messages, errors, strict=True):
            if err is None:
                kept.append(message)
                continue
            error = KafkaClientError.of(err)
            if error.partition_eof:
                continue
            if error.fatal:
                raise error
            log.warning("consumer error: %s", error)
        return kept

    def pause(self, partitions: Iterable[Partition]) -> None:
        """Stop fetching ``partitions`` (a paused partition drops what it had prefetched)."""
        client_call(self._consumer.pause, [TopicPartition(t, p) for t, p in partitions])

    def resume(self, partitions: Iterable[Partition]) -> None:
        """Fetch ``partitions`` again."""
        client_call(self._consumer.resume, [TopicPartition(t, p) for t, p in partitions])

    def seek(self, partition: Partition, offset: int) -> None:
        """Consume ``partition`` from ``offset`` on."""
        client_call(self._consumer.seek, TopicPartition(partition[0], partition[1], offset))

    def commit(self, offsets: dict[Partition, int]) -> None:
        """Commit ``offsets`` (the next offset to consume, per partition) asynchronously; the
        result comes to the :class:`CommitResults` the consumer was made with."""
        client_call(lambda: self._consumer.commit(offsets=_topic_partitions(offsets)))

    def commit_sync(self, offsets: dict[Partition, int]) -> dict[Partition, KafkaClientError]:
        """Commit ``offsets`` and wait for the result.

        Returns:
            The error of each partition whose offset was refused (empty: all committed).

        Raises:
            KafkaClientError: the commit as a whole failed.
        """
        try:
            result = self._consumer.commit(offsets=_topic_partitions(offsets), asynchronous=False)
        except KafkaException as exc:
            raise KafkaClientError.of(exc) from exc
        return _partition_errors(result) if result is not None else {}

    def group_metadata(self) -> object:
        """The consumer's group metadata, opaque (exactly-once sends it with the offsets)."""
        return client_call(self._consumer.consumer_group_metadata)

    def close(self) -> None:
        """Leave the group and close the client."""
        client_call(self._consumer.close)
