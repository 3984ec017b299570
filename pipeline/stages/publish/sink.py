"""The sink: one record per event of a scored batch to the output topic.

The sink is passive: it encodes the batch (one compiled call: the built-in Recommendation's
encoder, or the user's schema's, :mod:`pipeline.stages.publish.configured`) and produces its
records in one call, counted into its batch's :class:`~pipeline.types.Checkpoint`
(``checkpoint.expect(n)``), to which the Kafka edge acknowledges each one, so the broker's
acknowledgement flows back to the offsets it covers. What is committed, and when, is the commit
stage's business.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from pipeline.connectors.avro.write_program import WriteProgram
from pipeline.observability.metrics import Metrics
from pipeline.stages.publish.configured import SchemaEncoder
from pipeline.stages.publish.flags import FallbackFlags, fallback_flags
from pipeline.stages.publish.recommendation import RecommendationEncoder
from pipeline.types import (
    Checkpoint,
    EventColumns,
    FallbackFeature,
    FieldColumns,
    PreparedBatch,
    ScoredBatch,
)

__all__ = ["BatchSender", "EncodedBatch", "RecommendationSink", "RecordEncoder"]


class BatchSender(Protocol):
    """What the sink needs of the producer
    (:class:`~pipeline.runtime.backpressure.BackpressuredProducer` over the Kafka edge)."""

    def produce_batch(
        self, topic: str, values: list[bytes], keys: list[bytes], acks: Checkpoint
    ) -> None: ...


class RecordEncoder(Protocol):
    """Encodes a scored batch's records (:class:`RecommendationEncoder`,
    :class:`SchemaEncoder`)."""

    def encode(
        self, events: EventColumns, scored: ScoredBatch, flags: FallbackFlags, now_ms: int
    ) -> list[bytes]:
        """The record of every event, in event order (one compiled call).

        Args:
            events: the batch's events.
            scored: their top-K (flat, event-major, best first within each event), task
                scores and the model version that scored them.
            flags: per event, the feature groups that fell back to defaults.
            now_ms: when they were scored (``scored_at``), epoch milliseconds.

        Returns:
            One encoded value per event (with the Confluent header when so framed).
        """
        ...


@dataclass
class EncodedBatch:
    """A batch's records, ready to produce.

    Attributes:
        keys: per event, the record key (the user id, decimal).
        values: per event, the encoded record.
        flags: per event, the feature groups that fell back to defaults.
        produced_at_ms: when the records were made (``scored_at``), epoch milliseconds.
    """

    keys: list[bytes]
    values: list[bytes]
    flags: FallbackFlags
    produced_at_ms: int


class RecommendationSink:
    """Encodes and produces one record per event, keyed by user id: the built-in
    Recommendation, or a record of the user's output schema (``program``).

    Args:
        producer: shared with the dead-letter sink.
        topic: the output topic.
        header: what precedes each Avro body (the Confluent header of the registered output
            schema, or nothing in raw framing).
        metrics: events out, end-to-end latency, fallbacks, batch rows.
        program: the user's output schema and its roles, compiled (``[output]``); ``None``:
            the built-in Recommendation.

    Example::

        sink = RecommendationSink(producer, "recommendations", codec.header, metrics)
        latency_s = sink.publish(prepared, scored)
    """

    def __init__(
        self,
        producer: BatchSender,
        topic: str,
        header: bytes,
        metrics: Metrics,
        program: WriteProgram | None = None,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._metrics = metrics
        self._encoder: RecordEncoder = (
            RecommendationEncoder(header) if program is None else SchemaEncoder(header, program)
        )
        self._warm_up()

    def _warm_up(self) -> None:
        """Encode one record now: loads (or compiles) the encoder, so the first batch after
        the consumer joins does not wait for it."""
        one = np.ones(1, dtype=np.int64)
        events = EventColumns(
            # writable, as the decoder's columns are: numba compiles a read-only array apart
            event_id_bytes=np.array([ord("e")], dtype=np.uint8),
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
        encoder = self._encoder
        if isinstance(encoder, SchemaEncoder):  # what its program reads, one of each
            raw = encoder.raw_columns
            events.fields = FieldColumns.empty(1, raw=raw)
            events.fields.raw_present[:] = 1
            scored.task_scores = np.zeros((1, encoder.task_columns), dtype=np.float32)
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
        checkpoint.expect(len(encoded.values))
        self._producer.produce_batch(self._topic, encoded.values, encoded.keys, checkpoint)
        latency_s: npt.NDArray[np.float64] = (
            encoded.produced_at_ms - events.event_time_ms
        ) / 1000.0
        self._count(encoded.flags, events.num_events, events.num_rows, latency_s)
        return latency_s

    def encode(
        self, events: EventColumns, scored: ScoredBatch, flags: FallbackFlags, now_ms: int
    ) -> list[bytes]:
        """The record of every event (:meth:`RecordEncoder.encode` of this sink's encoder)."""
        return self._encoder.encode(events, scored, flags, now_ms)

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
