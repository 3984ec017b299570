"""Dead-letter topic: where every message the pipeline cannot score goes, untouched.

A dead-letter record keeps the original key, value and headers, and adds:

=====================  =======================================================
header                 value
=====================  =======================================================
``x-dlq-reason``       a :class:`pipeline.codec.RejectReason` value
``x-dlq-detail``       human-readable detail (truncated to 1 KiB)
``x-source-topic``     topic the message was consumed from
``x-source-partition`` its partition (decimal)
``x-source-offset``    its offset (decimal)
``x-dlq-time``         when it was dead-lettered, epoch milliseconds (decimal)
=====================  =======================================================
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Message, Producer

from pipeline.checkpointing import Checkpointer
from pipeline.codec import RejectedMessage
from pipeline.kafka_io import Headers, produce
from pipeline.metrics import Metrics

log = logging.getLogger(__name__)

REASON_HEADER = "x-dlq-reason"
DETAIL_HEADER = "x-dlq-detail"
_MAX_DETAIL = 1024


def dead_letter_headers(message: Message, rejection: RejectedMessage) -> Headers:
    """The original headers plus the ``x-dlq-*``/``x-source-*`` ones."""
    original = message.headers() or []
    headers: Headers = list(original.items()) if isinstance(original, dict) else list(original)
    headers += [
        (REASON_HEADER, rejection.reason.value.encode()),
        (DETAIL_HEADER, rejection.detail[:_MAX_DETAIL].encode("utf-8", "replace")),
        ("x-source-topic", (message.topic() or "").encode()),
        ("x-source-partition", str(message.partition()).encode()),
        ("x-source-offset", str(message.offset()).encode()),
        ("x-dlq-time", str(int(time.time() * 1000)).encode()),
    ]
    return headers


class DeadLetterSink:
    """Produces rejected messages to the dead-letter topic under the commit protocol.

    Args:
        producer: shared with the recommendation sink.
        topic: the dead-letter topic.
        checkpointer: the record guards the offset of the message it replaces.
        metrics: counts ``dlq`` by reason.
    """

    def __init__(
        self, producer: Producer, topic: str, checkpointer: Checkpointer, metrics: Metrics
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._checkpointer = checkpointer
        self._metrics = metrics

    def publish(self, message: Message, rejection: RejectedMessage) -> None:
        log.warning(
            "dead-lettering %s[%d]@%d: %s",
            message.topic(),
            message.partition(),
            message.offset(),
            rejection,
        )
        produce(
            self._producer,
            self._topic,
            message.value(),
            key=message.key(),
            headers=dead_letter_headers(message, rejection),
            on_delivery=self._checkpointer.delivery_callback(),
        )
        self._metrics.dead_lettered.labels(reason=rejection.reason.value).inc()
