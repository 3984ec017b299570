"""How large a record the input side takes in, tied to ``codec.max_message_bytes``.

The broker refuses, at produce time, a record batch over its topic's ``max.message.bytes``, so
that setting is the largest record the consumer can ever receive. streamrank creates its input
topic with ``topics.input_max_message_bytes`` (validated to hold a ``codec.max_message_bytes``
value and its framing, ``RECORD_OVERHEAD_BYTES``: a value just over the codec's limit still
reaches the pipeline and is dead-lettered, not refused at the producer), and sizes its
consumer's fetches from the topic's real limit, read from the broker at start-up
(:func:`input_record_limit`):

- ``max.partition.fetch.bytes`` = the limit: one partition's part of a fetch response;
- ``fetch.max.bytes`` = the limit, at least :data:`FETCH_FLOOR_BYTES`: a whole response (the
  broker returns one batch over it when it is first, to make progress; a batch is at most the
  limit, so no response is larger);
- ``receive.message.max.bytes`` = that plus :data:`RESPONSE_OVERHEAD_BYTES` (librdkafka needs at
  least ``fetch.max.bytes`` + 512): the largest response the consumer reads. Sized from the
  topic's real limit, it never refuses a batch the topic holds, so no partition stalls.

librdkafka's prefetch queue (``queued.max.messages.kbytes``, 64 MiB by default) bounds what waits
in the client between polls. A ``[kafka.consumer_extra]`` value for any of these wins.

Example::

    limit = input_record_limit(settings.kafka.config, settings.topics.input)
    consumer = make_consumer(settings.kafka.config, defaults=consumer_fetch_limits(limit))
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from pipeline.connectors.kafka.admin import make_admin
from pipeline.settings.kafka import KafkaClientConfig

__all__ = [
    "FETCH_FLOOR_BYTES",
    "RESPONSE_OVERHEAD_BYTES",
    "consumer_fetch_limits",
    "input_record_limit",
]

log = logging.getLogger(__name__)

FETCH_FLOOR_BYTES = 16 * 2**20
"""The least ``fetch.max.bytes``: enough events per fetch however small the record limit."""
RESPONSE_OVERHEAD_BYTES = 64 * 1024
"""Protocol framing of a fetch response beyond its records (per-partition headers)."""


def consumer_fetch_limits(record_limit: int) -> dict[str, int]:
    """librdkafka consumer properties for a topic whose record batches are at most
    ``record_limit`` bytes (see the module docstring).

    Args:
        record_limit: the input topic's ``max.message.bytes``.

    Returns:
        ``max.partition.fetch.bytes``, ``fetch.max.bytes`` and ``receive.message.max.bytes``.

    Example::

        consumer_fetch_limits(1_048_588)["receive.message.max.bytes"]  # 16,842,752
    """
    fetch = max(record_limit, FETCH_FLOOR_BYTES)
    return {
        "max.partition.fetch.bytes": record_limit,
        "fetch.max.bytes": fetch,
        "receive.message.max.bytes": fetch + RESPONSE_OVERHEAD_BYTES,
    }


def input_record_limit(
    kafka: KafkaClientConfig,
    topic: str,
    timeout_s: float = 15.0,
    admin: AdminClient | None = None,
) -> int | None:
    """The topic's ``max.message.bytes`` as the broker applies it (its own, or the broker's).

    Args:
        kafka: where the cluster is (``settings.kafka.config``).
        topic: the input topic.
        timeout_s: how long to wait for the broker.
        admin: the admin client to ask (``None``: one of ``kafka``).

    Returns:
        The limit in bytes; ``None`` when it cannot be read (no such topic yet, or no
        ``DescribeConfigs`` permission): logged, and the consumer keeps librdkafka's limits.
    """
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        admin = admin or make_admin(kafka)  # kept alive until the answer comes
        future = admin.describe_configs([resource], request_timeout=timeout_s)[resource]
        entry = future.result(timeout=timeout_s).get("max.message.bytes")
        if entry is None or entry.value is None:
            raise LookupError("no max.message.bytes in the topic's configuration")
        return int(entry.value)
    except (KafkaException, LookupError, ValueError, TimeoutError) as exc:
        log.warning(
            "cannot read max.message.bytes of topic %s (%s): the consumer keeps librdkafka's "
            "fetch limits (receive.message.max.bytes 100 MB)",
            topic,
            exc,
        )
        return None
