"""The producer at the edge: streamrank's output records and their acknowledgements in, librdkafka
behind.

:class:`OutputProducer` wraps librdkafka's producer (``confluent_kafka.Producer``, or a fake of
it in unit tests: :class:`RawProducer`):

- :meth:`OutputProducer.send` queues a batch's records (values and keys, one call per batch);
  :meth:`OutputProducer.send_one` one record with headers (a dead letter). Each record's
  acknowledgement flows back to the :class:`DeliveryAcks` it was sent for (a
  :class:`~pipeline.types.Checkpoint`): one fewer pending, or the first failure's reason. A full
  local queue is reported (how many records were queued), never raised: the caller decides how
  long to wait (:mod:`pipeline.runtime.backpressure`);
- the transactional calls of exactly-once take ``{(topic, partition): offset}`` and raise
  :class:`~pipeline.connectors.kafka.errors.KafkaClientError`.

Example::

    producer = OutputProducer(make_producer(settings.kafka.config))
    checkpoint.expect(len(values))
    queued = producer.send("recommendations", values, keys, checkpoint)
    producer.poll(0)   # acknowledgements arrive in here
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from pipeline.connectors.kafka.errors import KafkaClientError, client_call
from pipeline.types import Headers, Partition

__all__ = ["DeliveryAcks", "OutputProducer", "RawProducer"]

DeliveryCallback = Callable[[KafkaError | None, Message], None]
"""The ``on_delivery`` signature of ``confluent_kafka.Producer.produce``."""


class RawProducer(Protocol):
    """What the edge calls of librdkafka's producer (``confluent_kafka.Producer``)."""

    def produce(
        self,
        topic: str,
        value: bytes | None = ...,
        key: bytes | None = ...,
        *,
        headers: Headers | None = ...,
        on_delivery: DeliveryCallback | None = ...,
    ) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...


class DeliveryAcks(Protocol):
    """What a record's acknowledgement reaches (:class:`~pipeline.types.Checkpoint`)."""

    pending: int
    """Records sent for it and not acknowledged yet (the sender counts them in)."""

    def failed(self, reason: str) -> None:
        """A record sent for it was not delivered."""
        ...


class _Deliveries:
    """The ``on_delivery`` of every record sent for one :class:`DeliveryAcks`."""

    __slots__ = ("acks",)

    def __init__(self, acks: DeliveryAcks) -> None:
        self.acks = acks

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        acks = self.acks
        acks.pending -= 1
        if err is not None:
            acks.failed(f"delivery to {msg.topic()} failed: {err}")


class OutputProducer:
    """The producer every output and dead-letter record goes through (see the module
    docstring).

    Args:
        producer: librdkafka's producer (or a fake of it).
    """

    def __init__(self, producer: RawProducer) -> None:
        self._producer = producer

    def send(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None],
        acks: DeliveryAcks,
        start: int = 0,
    ) -> int:
        """Queue records ``start`` onwards (each value with its key), in order, until the
        local queue is full; each is acknowledged to ``acks`` (which counts them in first:
        ``acks.pending`` is not changed here).

        Returns:
            How many of ``values`` are queued now (``len(values)``: all of them).

        Raises:
            KafkaClientError: the client refused a record for another reason than a full
                queue.
        """
        produce, on_delivery = self._producer.produce, _Deliveries(acks).on_delivery
        at = start
        try:
            for at in range(start, len(values)):
                produce(topic, values[at], keys[at], on_delivery=on_delivery)
        except BufferError:
            return at
        except KafkaException as exc:
            raise KafkaClientError.of(exc) from exc
        return len(values)

    def send_one(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers | None,
        acks: DeliveryAcks,
    ) -> bool:
        """Queue one record with its headers, acknowledged to ``acks``.

        Returns:
            Whether it is queued (``False``: the local queue is full).

        Raises:
            KafkaClientError: the client refused it for another reason.
        """
        try:
            self._producer.produce(
                topic, value, key, headers=headers, on_delivery=_Deliveries(acks).on_delivery
            )
        except BufferError:
            return False
        except KafkaException as exc:
            raise KafkaClientError.of(exc) from exc
        return True

    def poll(self, timeout: float = 0) -> int:
        """Serve acknowledgements (waiting at most ``timeout`` for one); returns how many."""
        return int(client_call(self._producer.poll, timeout))

    def flush(self, timeout: float = 0) -> int:
        """Wait for every acknowledgement, at most ``timeout``; returns how many are missing."""
        return int(client_call(self._producer.flush, timeout))

    # exactly-once (a producer configured with ``transactional.id``)

    def init_transactions(self, timeout_s: float) -> None:
        client_call(self._raw.init_transactions, timeout_s)

    def begin_transaction(self) -> None:
        client_call(self._raw.begin_transaction)

    def send_offsets_to_transaction(
        self, offsets: dict[Partition, int], group_metadata: object, timeout_s: float
    ) -> None:
        """Put consumed ``offsets`` (next offset per partition) into the open transaction."""
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        client_call(self._raw.send_offsets_to_transaction, tps, group_metadata, timeout_s)

    def commit_transaction(self, timeout_s: float) -> None:
        client_call(self._raw.commit_transaction, timeout_s)

    def abort_transaction(self, timeout_s: float) -> None:
        client_call(self._raw.abort_transaction, timeout_s)

    @property
    def _raw(self) -> Any:
        """The client, with its transactional calls (not in :class:`RawProducer`)."""
        return self._producer
