"""Kafka clients: creation from ``[kafka]``, topic set-up, and the clients of one loop.

:func:`connect` makes the loop's clients (the real broker; unit tests pass fakes of the client
through :meth:`KafkaClients.of`): librdkafka's consumer and producer, each behind its edge
(:class:`~pipeline.connectors.kafka.consumer.InputConsumer`,
:class:`~pipeline.connectors.kafka.producer.OutputProducer`), so that no stage sees a client type.
:func:`make_consumer`, :func:`make_producer` and :func:`produce` make and use the bare clients
(the client tools of :mod:`pipeline.tools`). Every client is made of ``[kafka]``'s librdkafka
configuration, built once when the settings were read (``settings.kafka.config``, a
:class:`~pipeline.settings.kafka.KafkaClientConfig`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.connectors.kafka.admin import CLIENT_LOGGER, make_admin
from pipeline.connectors.kafka.consumer import CommitResults, InputConsumer, RawConsumer
from pipeline.connectors.kafka.limits import consumer_fetch_limits, input_record_limit
from pipeline.connectors.kafka.producer import DeliveryCallback, OutputProducer, RawProducer
from pipeline.settings.kafka import KafkaClientConfig
from pipeline.settings.topics import TopicsSettings
from pipeline.types import Headers

log = logging.getLogger(__name__)


ErrorCallback = Callable[[KafkaError], None]
"""librdkafka's ``error_cb``: client-level errors (broker down, auth failed...)."""


def log_client_error(err: KafkaError) -> None:
    """Default ``error_cb``: transient errors are logged, fatal ones too (the loop raises)."""
    level = logging.ERROR if err.fatal() else logging.WARNING
    log.log(level, "kafka client error: %s", err)


def make_consumer(
    kafka: KafkaClientConfig,
    *,
    group_id: str | None = None,
    error_cb: ErrorCallback = log_client_error,
    stats_cb: Callable[[str], None] | None = None,
    extra: dict[str, Any] | None = None,
    defaults: dict[str, Any] | None = None,
) -> Consumer:
    """A consumer with manual commits (see :mod:`pipeline.stages.commit`) of ``kafka.consumer``
    (``settings.kafka.config``), in ``group_id``'s consumer group when given (a tool's own; a
    ``group.id`` of ``consumer_extra`` still wins, as over ``kafka.group_id``); ``defaults``
    are properties the settings (``consumer_extra`` included) may override, ``extra`` override
    them."""
    conf = {**(defaults or {}), **kafka.consumer}
    if group_id and not kafka.fixed_group:
        conf["group.id"] = group_id
    conf["error_cb"] = error_cb
    conf["logger"] = CLIENT_LOGGER
    if stats_cb is not None:
        conf.setdefault("statistics.interval.ms", 5000)
        conf["stats_cb"] = stats_cb
    conf.update(extra or {})
    return Consumer(conf)


def make_producer(
    kafka: KafkaClientConfig,
    *,
    error_cb: ErrorCallback = log_client_error,
    extra: dict[str, Any] | None = None,
) -> Producer:
    """An idempotent ``acks=all`` producer of ``kafka.producer`` (``settings.kafka.config``)."""
    conf = dict(kafka.producer)
    conf["error_cb"] = error_cb
    conf["logger"] = CLIENT_LOGGER
    conf.update(extra or {})
    return Producer(conf)


def produce(
    producer: RawProducer,
    topic: str,
    value: bytes | None,
    *,
    key: bytes | None = None,
    headers: Headers | None = None,
    on_delivery: DeliveryCallback | None = None,
) -> None:
    """``producer.produce`` that waits (serving callbacks) while the local queue is full."""
    while True:
        try:
            producer.produce(topic, value, key, headers=headers, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.05)


def ensure_topics(
    kafka: KafkaClientConfig,
    topics: TopicsSettings,
    names: Sequence[str] | None = None,
    admin: AdminClient | None = None,
) -> None:
    """Create the pipeline's topics when missing (``topics.create_missing``).

    Args:
        kafka: where the cluster is (``settings.kafka.config``).
        topics: names, partition count and replication factor.
        names: a subset to create; defaults to input, output and DLQ.
        admin: the admin client to ask (``None``: one of ``kafka``).
    """
    if not topics.create_missing:
        return
    wanted = list(names or (topics.input, topics.output, topics.dlq))
    admin = admin or make_admin(kafka)
    existing = set(admin.list_topics(timeout=15).topics)
    input_config = {"max.message.bytes": str(topics.input_max_message_bytes)}
    missing = [
        NewTopic(
            name,
            num_partitions=topics.partitions,
            replication_factor=topics.replication_factor,
            config=input_config if name == topics.input else {},
        )
        for name in wanted
        if name not in existing
    ]
    if not missing:
        return
    for name, future in admin.create_topics(missing, operation_timeout=15).items():
        try:
            future.result()
            log.info("created topic %s (%d partitions)", name, topics.partitions)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


@dataclass
class KafkaClients:
    """The clients one scoring loop uses, at the edge (real ones from :func:`connect`, fakes of
    the client in tests: :meth:`of`)."""

    consumer: InputConsumer
    producer: OutputProducer
    commit_results: CommitResults | None = None
    """Where the consumer reports commit results (``None``: commits are taken as done)."""
    new_producer: Callable[[], OutputProducer] | None = None
    """Makes another producer configured as :attr:`producer` (exactly-once replaces one whose
    transactional call never came back; ``None``: it cannot)."""

    @classmethod
    def of(
        cls,
        consumer: RawConsumer,
        producer: RawProducer,
        commit_results: CommitResults | None = None,
        new_producer: Callable[[], RawProducer] | None = None,
    ) -> KafkaClients:
        """The clients of a loop over librdkafka's consumer and producer (or fakes of them).

        Example::

            clients = KafkaClients.of(FakeConsumer(), FakeProducer())
        """
        renew = None
        if new_producer is not None:
            make = new_producer

            def renew() -> OutputProducer:
                return OutputProducer(make())

        return cls(InputConsumer(consumer), OutputProducer(producer), commit_results, renew)


ClientFactory = Callable[[KafkaClientConfig, TopicsSettings, Callable[[str], None]], KafkaClients]
"""Builds a loop's clients from its librdkafka configuration, its topics and a ``stats_cb``."""


def connect(
    kafka: KafkaClientConfig, topics: TopicsSettings, stats_cb: Callable[[str], None]
) -> KafkaClients:
    """Create missing topics, then an idempotent producer and a manual-commit consumer whose
    fetches are sized from the input topic's record limit
    (:mod:`pipeline.connectors.kafka.limits`).

    Args:
        kafka: where the cluster is and how to talk to it (``settings.kafka.config``, or
            exactly-once's: :func:`pipeline.stages.commit.transactional_kafka`).
        topics: the pipeline's topics.
        stats_cb: receives librdkafka's statistics JSON (consumer lag and more).

    Returns:
        The clients (the consumer is not subscribed yet).

    Example::

        clients = connect(settings.kafka.config, settings.topics, metrics.record_librdkafka_stats)
    """
    admin = make_admin(kafka)  # one for both questions
    ensure_topics(kafka, topics, admin=admin)
    record_limit = input_record_limit(kafka, topics.input, admin=admin)
    if record_limit is not None and record_limit > topics.input_max_message_bytes:
        log.warning(
            "topic %s takes records up to %d bytes (its max.message.bytes), more than "
            "topics.input_max_message_bytes = %d: the consumer takes them in (set the topic's "
            "max.message.bytes to bound the input side's memory)",
            topics.input,
            record_limit,
            topics.input_max_message_bytes,
        )
    limits = consumer_fetch_limits(record_limit) if record_limit is not None else {}
    results = CommitResults()
    return KafkaClients.of(
        make_consumer(kafka, stats_cb=stats_cb, extra={"on_commit": results}, defaults=limits),
        make_producer(kafka),
        results,
        lambda: make_producer(kafka),
    )
