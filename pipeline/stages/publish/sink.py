"""Publish: one Recommendation per event of a scored batch to the output topic.

The sink is passive: it encodes the batch (one compiled call,
:mod:`pipeline.connectors.avro.kernels`) and produces each record with its batch's
:class:`~pipeline.types.Checkpoint` as the delivery callback (``checkpoint.expect_delivery()``), so
the broker's acknowledgement flows back to the offsets it covers. What is committed, and when, is
the commit stage's business.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from model.features.segments import offsets, starts
from pipeline.connectors.avro.kernels import encode_recommendations
from pipeline.connectors.kafka.clients import RecordProducer
from pipeline.observability.metrics import Metrics
from pipeline.types import Enrichment, EventColumns, FallbackFeature, PreparedBatch, ScoredBatch

__all__ = ["EncodedBatch", "FallbackFlags", "RecommendationSink", "fallback_flags"]

_MAX_VARINT = 10
_FALLBACK_NAMES = np.frombuffer(
    (FallbackFeature.USER.value + FallbackFeature.ITEM.value).encode(), dtype=np.uint8
)
_FALLBACK_OFFSETS = np.array(
    [0, len(FallbackFeature.USER.value), len(_FALLBACK_NAMES)], dtype=np.int64
)


@dataclass
class FallbackFlags:
    """Per event: which feature groups fell back to defaults (``fallback_features``)."""

    user: npt.NDArray[np.bool_]
    item: npt.NDArray[np.bool_]


@dataclass
class EncodedBatch:
    """A batch's Recommendation records, ready to produce.

    Attributes:
        keys: per event, the record key (the user id, decimal).
        values: per event, the encoded Recommendation.
        flags: per event, the feature groups that fell back to defaults.
        produced_at_ms: ``scored_at`` of every record, epoch milliseconds.
    """

    keys: list[bytes]
    values: list[bytes]
    flags: FallbackFlags
    produced_at_ms: int


def fallback_flags(events: EventColumns, enrichment: Enrichment) -> FallbackFlags:
    """Per-event flags; an event's item flag is set when any of its candidates fell back."""
    event_starts = starts(events.candidate_counts)
    item_any = (
        np.logical_or.reduceat(enrichment.item_missing, event_starts)
        if len(event_starts)
        else event_starts
    )
    return FallbackFlags(user=enrichment.user_missing.copy(), item=item_any.astype(bool))


class RecommendationSink:
    """Encodes and produces one Recommendation per event, keyed by user id.

    Args:
        producer: shared with the dead-letter sink.
        topic: the output topic.
        header: what precedes each Avro body (the Confluent header of the registered
            Recommendation schema, or nothing in raw framing).
        metrics: events out, end-to-end latency, fallbacks, batch rows.

    Example::

        sink = RecommendationSink(producer, "recommendations", codec.header, metrics)
        latency_s = sink.publish(prepared, scored)
    """

    def __init__(
        self, producer: RecordProducer, topic: str, header: bytes, metrics: Metrics
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._header = np.frombuffer(header, dtype=np.uint8)
        self._metrics = metrics
        self._warm_up()

    def _warm_up(self) -> None:
        """Encode one record now: loads (or compiles) the encoder, so the first batch after
        the consumer joins does not wait for it."""
        one = np.ones(1, dtype=np.int64)
        events = EventColumns(
            event_id_bytes=np.frombuffer(b"e", dtype=np.uint8),
            event_id_offsets=np.array([0, 1], dtype=np.int64),
            user_ids=one,
            event_time_ms=one,
            device_ids=one,
            country_ids=one,
            num_results=one,
            candidate_counts=one,
            candidate_ids=one,
            recent_counts=np.zeros(1, dtype=np.int64),
            recent_ids=np.zeros(0, dtype=np.int64),
            retrieved=np.zeros(1, dtype=bool),
        )
        scored = ScoredBatch(one, one, np.ones(1), "warm-up")
        no = np.zeros(1, dtype=bool)
        self.encode(events, scored, FallbackFlags(user=no, item=no), 0)

    def publish(self, prepared: PreparedBatch, scored: ScoredBatch) -> npt.NDArray[np.float64]:
        """:meth:`encode_batch` then :meth:`send`.

        Returns:
            float64[E] end-to-end latency of each event (event_time -> produced), seconds.
        """
        return self.send(prepared, self.encode_batch(prepared, scored))

    def encode_batch(self, prepared: PreparedBatch, scored: ScoredBatch) -> EncodedBatch:
        """The batch's records, encoded; nothing is produced yet (an error here leaves
        nothing half-sent)."""
        events = prepared.batch.events
        flags = fallback_flags(events, prepared.enrichment)
        now_ms = int(time.time() * 1000)
        return EncodedBatch(
            keys=[b"%d" % u for u in events.user_ids.tolist()],
            values=self.encode(events, scored, flags, now_ms),
            flags=flags,
            produced_at_ms=now_ms,
        )

    def send(self, prepared: PreparedBatch, encoded: EncodedBatch) -> npt.NDArray[np.float64]:
        """Produce the records, each guarding the batch's checkpoint.

        Returns:
            float64[E] end-to-end latency of each event (event_time -> produced), seconds.
        """
        events, checkpoint = prepared.batch.events, prepared.batch.checkpoint
        produce = self._producer.produce
        for key, value in zip(encoded.keys, encoded.values, strict=True):
            produce(self._topic, value, key, on_delivery=checkpoint.expect_delivery())
        latency_s: npt.NDArray[np.float64] = (
            encoded.produced_at_ms - events.event_time_ms
        ) / 1000.0
        self._count(encoded.flags, events.num_events, events.num_rows, latency_s)
        return latency_s

    def encode(
        self,
        events: EventColumns,
        scored: ScoredBatch,
        flags: FallbackFlags,
        now_ms: int,
    ) -> list[bytes]:
        """The Recommendation value of every event, in event order (one compiled call).

        Args:
            events: the batch's events (ids, user ids, ``retrieved``).
            scored: their top-K (flat, event-major, best first within each event) and the
                model version that scored them.
            flags: per event, the feature groups that fell back to defaults.
            now_ms: ``scored_at``, epoch milliseconds.

        Returns:
            One encoded value per event (with the Confluent header when so framed).
        """
        n = events.num_events
        id_bytes, id_offsets = events.event_id_bytes, events.event_id_offsets
        version = np.frombuffer(scored.model_version.encode(), dtype=np.uint8)
        header = self._header
        per_event = len(header) + len(version) + 8 * _MAX_VARINT + 3 + len(_FALLBACK_NAMES)
        capacity = len(id_bytes) + n * per_event
        capacity += len(scored.item_ids) * (_MAX_VARINT + 8)
        out = np.empty(capacity + 16, dtype=np.uint8)
        out_offsets = np.empty(n + 1, dtype=np.int64)
        encode_recommendations(
            header, id_bytes, id_offsets, events.user_ids.astype(np.int64, copy=False),
            offsets(scored.counts), scored.item_ids.astype(np.int64, copy=False),
            np.ascontiguousarray(scored.scores, dtype="<f8").view(np.uint8), version, now_ms,
            flags.user, flags.item, _FALLBACK_NAMES, _FALLBACK_OFFSETS,
            events.retrieved.astype(bool, copy=False), out, out_offsets,
        )  # fmt: skip
        data = out.tobytes()
        bounds = out_offsets.tolist()
        return [data[lo:hi] for lo, hi in itertools.pairwise(bounds)]

    def _count(
        self, flags: FallbackFlags, events: int, rows: int, latency_s: npt.NDArray[np.float64]
    ) -> None:
        metrics = self._metrics
        metrics.events_out.inc(events)
        metrics.end_to_end_seconds.observe_many(latency_s)
        for feature, mask in (
            (FallbackFeature.USER, flags.user),
            (FallbackFeature.ITEM, flags.item),
        ):
            count = int(np.count_nonzero(mask))
            if count:
                metrics.fallbacks.labels(feature=feature.value).inc(count)
        metrics.batch_rows.observe(rows)
