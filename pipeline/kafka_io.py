"""Thin wrappers over confluent-kafka clients: creation, back-pressured produce, topic setup."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.checkpointing import DeliveryCallback
from pipeline.config import KafkaSettings, TopicsSettings

log = logging.getLogger(__name__)

ErrorCallback = Callable[[KafkaError], None]
"""librdkafka's ``error_cb``: client-level errors (broker down, auth failed...)."""

Headers = list[tuple[str, str | bytes | None]]


def log_client_error(err: KafkaError) -> None:
    """Default ``error_cb``: transient errors are logged, fatal ones too (the loop raises)."""
    level = logging.ERROR if err.fatal() else logging.WARNING
    log.log(level, "kafka client error: %s", err)


def make_consumer(
    settings: KafkaSettings,
    *,
    group_id: str | None = None,
    error_cb: ErrorCallback = log_client_error,
    stats_cb: Callable[[str], None] | None = None,
    extra: dict[str, Any] | None = None,
) -> Consumer:
    """A consumer with manual commits (see :mod:`pipeline.checkpointing`)."""
    conf = settings.consumer_config(group_id)
    conf["error_cb"] = error_cb
    if stats_cb is not None:
        conf.setdefault("statistics.interval.ms", 5000)
        conf["stats_cb"] = stats_cb
    conf.update(extra or {})
    return Consumer(conf)


def make_producer(
    settings: KafkaSettings,
    *,
    error_cb: ErrorCallback = log_client_error,
    extra: dict[str, Any] | None = None,
) -> Producer:
    """An idempotent ``acks=all`` producer."""
    conf = settings.producer_config()
    conf["error_cb"] = error_cb
    conf.update(extra or {})
    return Producer(conf)


def produce(
    producer: Producer,
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
    settings: KafkaSettings, topics: TopicsSettings, names: Sequence[str] | None = None
) -> None:
    """Create the pipeline's topics when missing (``topics.create_missing``).

    Args:
        settings: where the cluster is.
        topics: names, partition count and replication factor.
        names: a subset to create; defaults to input, output and DLQ.
    """
    if not topics.create_missing:
        return
    wanted = list(names or (topics.input, topics.output, topics.dlq))
    admin = AdminClient(settings.admin_config())
    existing = set(admin.list_topics(timeout=15).topics)
    missing = [
        NewTopic(
            name, num_partitions=topics.partitions, replication_factor=topics.replication_factor
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
