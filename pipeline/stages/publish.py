"""Publish: scored batches to the output topic, rejected messages to the dead-letter topic.

Both sinks share the producer and take the :class:`~pipeline.stages.commit.Checkpoint` whose
offsets a record guards: each produced record registers with ``checkpoint.expect_delivery()``,
so the broker's acknowledgement flows back to the offsets it covers. The sinks never decide
what is committed (that is :mod:`pipeline.stages.commit`).

A dead-letter record keeps the original key, value and headers, and adds:

=====================  =======================================================
header                 value
=====================  =======================================================
``x-dlq-reason``       a :class:`pipeline.stages.decode.RejectReason` value
``x-dlq-detail``       human-readable detail (truncated to 1 KiB)
``x-source-topic``     topic the message was consumed from
``x-source-partition`` its partition (decimal)
``x-source-offset``    its offset (decimal)
``x-dlq-time``         when it was dead-lettered, epoch milliseconds (decimal)
=====================  =======================================================
"""

from __future__ import annotations

import itertools
import logging
import time

import numpy as np
import numpy.typing as npt
from confluent_kafka import Message

from model.segments import offsets
from pipeline.kafka_io import Headers, RecordProducer, produce
from pipeline.metrics import Metrics
from pipeline.stages.avro_kernels import encode_recommendations
from pipeline.stages.batch import EventColumns
from pipeline.stages.commit import Checkpoint
from pipeline.stages.decode import RecordCodec, RejectedMessage
from pipeline.stages.enrich import FallbackFeature
from pipeline.stages.features import FallbackFlags, fallback_flags
from pipeline.stages.score import PreparedBatch, ScoredBatch

log = logging.getLogger(__name__)

_MAX_VARINT = 10
_FALLBACK_NAMES = np.frombuffer(
    (FallbackFeature.USER.value + FallbackFeature.ITEM.value).encode(), dtype=np.uint8
)
_FALLBACK_OFFSETS = np.array(
    [0, len(FallbackFeature.USER.value), len(_FALLBACK_NAMES)], dtype=np.int64
)

REASON_HEADER = "x-dlq-reason"
DETAIL_HEADER = "x-dlq-detail"
_MAX_DETAIL = 1024


class RecommendationSink:
    """Encodes and produces one Recommendation per event, keyed by user id.

    Args:
        producer: shared with the dead-letter sink.
        topic: the output topic.
        codec: Recommendation codec in the configured framing.
        metrics: events out, end-to-end latency, fallbacks, batch rows.

    Example::

        sink = RecommendationSink(producer, "recommendations", codec, metrics)
        latency_s = sink.publish(batch, scored, model_version="m-1")
    """

    def __init__(
        self, producer: RecordProducer, topic: str, codec: RecordCodec, metrics: Metrics
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._codec = codec
        self._metrics = metrics

    def publish(
        self, batch: PreparedBatch, scored: ScoredBatch, model_version: str
    ) -> npt.NDArray[np.float64]:
        """Produce one Recommendation per event of ``batch``, guarding its checkpoint.

        Args:
            batch: the events, their enrichment and their checkpoint.
            scored: the batch's top-K (flat, event-major, best first within each event).
            model_version: of the model that scored the batch.

        Returns:
            float64[E] end-to-end latency of each event (event_time -> produced), seconds.
        """
        events, checkpoint = batch.events, batch.checkpoint
        flags = fallback_flags(events, batch.enrichment)
        now_ms = int(time.time() * 1000)
        values = self.encode(events, scored, flags, model_version, now_ms)
        keys = [str(u).encode() for u in events.user_ids.tolist()]
        for key, value in zip(keys, values, strict=True):
            produce(
                self._producer,
                self._topic,
                value,
                key=key,
                on_delivery=checkpoint.expect_delivery(),
            )
        latency_s: npt.NDArray[np.float64] = (now_ms - events.event_time_ms) / 1000.0
        self._count(flags, events.num_events, events.num_rows, latency_s)
        return latency_s

    def encode(
        self,
        events: EventColumns,
        scored: ScoredBatch,
        flags: FallbackFlags,
        model_version: str,
        now_ms: int,
    ) -> list[bytes]:
        """The Recommendation value of every event of ``batch``, in event order.

        Args:
            events: the batch's events (ids, user ids).
            scored: their top-K (flat, event-major, best first within each event).
            flags: per event, the feature groups that fell back to defaults.
            model_version: of the model that scored the batch.
            now_ms: ``scored_at``, epoch milliseconds.

        Returns:
            One encoded value per event (with the Confluent header when so framed).
        """
        ids = [e.encode() for e in events.event_ids]
        id_bytes = np.frombuffer(b"".join(ids), dtype=np.uint8)
        id_offsets = offsets(np.fromiter(map(len, ids), np.int64, len(ids)))
        version = np.frombuffer(model_version.encode(), dtype=np.uint8)
        header = np.frombuffer(self._codec.header, dtype=np.uint8)
        per_event = len(header) + len(version) + 8 * _MAX_VARINT + 2 + len(_FALLBACK_NAMES)
        capacity = len(id_bytes) + len(ids) * per_event
        capacity += len(scored.item_ids) * (_MAX_VARINT + 8)
        out = np.empty(capacity + 16, dtype=np.uint8)
        out_offsets = np.empty(len(ids) + 1, dtype=np.int64)
        encode_recommendations(
            header, id_bytes, id_offsets, events.user_ids.astype(np.int64, copy=False),
            offsets(scored.counts), scored.item_ids.astype(np.int64, copy=False),
            np.ascontiguousarray(scored.scores, dtype="<f8").view(np.uint8), version, now_ms,
            flags.user, flags.item, _FALLBACK_NAMES, _FALLBACK_OFFSETS, out, out_offsets,
        )  # fmt: skip
        data = out.tobytes()
        bounds = out_offsets.tolist()
        return [data[lo:hi] for lo, hi in itertools.pairwise(bounds)]

    def _count(
        self, flags: FallbackFlags, events: int, rows: int, latency_s: npt.NDArray[np.float64]
    ) -> None:
        metrics = self._metrics
        metrics.events_out.inc(events)
        for value in latency_s.tolist():
            metrics.end_to_end_seconds.observe(value)
        for feature, mask in (
            (FallbackFeature.USER, flags.user),
            (FallbackFeature.ITEM, flags.item),
        ):
            count = int(mask.sum())
            if count:
                metrics.fallbacks.labels(feature=feature.value).inc(count)
        metrics.batch_rows.observe(rows)


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
    """Produces rejected messages, untouched, to the dead-letter topic.

    Args:
        producer: shared with the recommendation sink.
        topic: the dead-letter topic.
        metrics: counts dead letters by reason.

    Example::

        dlq = DeadLetterSink(producer, "user-events-dlq", metrics)
        dlq.publish(message, rejection, checkpointer.open)
    """

    def __init__(self, producer: RecordProducer, topic: str, metrics: Metrics) -> None:
        self._producer = producer
        self._topic = topic
        self._metrics = metrics

    def publish(self, message: Message, rejection: RejectedMessage, checkpoint: Checkpoint) -> None:
        """Dead-letter ``message``; its record guards ``checkpoint`` (the open one)."""
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
            on_delivery=checkpoint.expect_delivery(),
        )
        self._metrics.dead_lettered.labels(reason=rejection.reason.value).inc()
