"""Dead letters: a message that cannot be scored goes, untouched, to the dead-letter topic.

The record keeps the original key, value and headers, and adds:

=====================  =======================================================
header                 value
=====================  =======================================================
``x-dlq-reason``       a :class:`pipeline.types.RejectReason` value
``x-dlq-detail``       human-readable detail (truncated to 1 KiB)
``x-source-topic``     topic the message was consumed from
``x-source-partition`` its partition (decimal)
``x-source-offset``    its offset (decimal)
``x-dlq-time``         when it was dead-lettered, epoch milliseconds (decimal)
=====================  =======================================================

Like the recommendation sink it is passive: each record guards the checkpoint it is given.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from pipeline.observability.metrics import Metrics
from pipeline.types import Checkpoint, ConsumedMessage, Headers, RejectedMessage

__all__ = ["DETAIL_HEADER", "REASON_HEADER", "DeadLetterSink", "dead_letter_headers"]

log = logging.getLogger(__name__)

REASON_HEADER = "x-dlq-reason"
DETAIL_HEADER = "x-dlq-detail"
_MAX_DETAIL = 1024


class RecordSender(Protocol):
    """What the sink needs of the producer
    (:class:`~pipeline.runtime.backpressure.BackpressuredProducer` over the Kafka edge)."""

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers | None,
        acks: Checkpoint,
    ) -> None: ...


def dead_letter_headers(message: ConsumedMessage, rejection: RejectedMessage) -> Headers:
    """The original headers plus the ``x-dlq-*``/``x-source-*`` ones."""
    headers: Headers = list(message.headers or [])
    headers += [
        (REASON_HEADER, rejection.reason.value.encode()),
        (DETAIL_HEADER, rejection.detail[:_MAX_DETAIL].encode("utf-8", "replace")),
        ("x-source-topic", message.topic.encode()),
        ("x-source-partition", str(message.partition).encode()),
        ("x-source-offset", str(message.offset).encode()),
        ("x-dlq-time", str(int(time.time() * 1000)).encode()),
    ]
    return headers


class DeadLetterSink:
    """Produces rejected messages, untouched, to the dead-letter topic.

    Args:
        producer: shared with the recommendation sink.
        topic: the dead-letter topic.
        metrics: counts dead letters by reason.

    Example::

        dlq = DeadLetterSink(producer, "user-events-dlq", metrics)
        dlq.publish(decoded.messages.message(index), rejection, checkpointer.open)
    """

    def __init__(self, producer: RecordSender, topic: str, metrics: Metrics) -> None:
        self._producer = producer
        self._topic = topic
        self._metrics = metrics

    def publish(
        self, message: ConsumedMessage, rejection: RejectedMessage, checkpoint: Checkpoint
    ) -> None:
        """Dead-letter ``message``; its record guards ``checkpoint``."""
        log.warning(
            "dead-lettering %s[%d]@%d: %s",
            message.topic,
            message.partition,
            message.offset,
            rejection,
        )
        checkpoint.expect()
        self._producer.produce(
            self._topic,
            message.value,
            message.key,
            dead_letter_headers(message, rejection),
            checkpoint,
        )
        self._metrics.dead_lettered.labels(reason=rejection.reason.value).inc()
