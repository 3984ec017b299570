"""Sink: one Recommendation per event, produced to the output topic keyed by user id."""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt
from confluent_kafka import Producer

from model.segments import offsets
from pipeline.checkpointing import Checkpoint, Checkpointer
from pipeline.codec import RecordCodec
from pipeline.features import FallbackFlags
from pipeline.kafka_io import produce
from pipeline.metrics import Metrics


class RecommendationSink:
    """Encodes and produces a scored batch under the commit protocol.

    Args:
        producer: shared with the dead-letter sink.
        topic: the output topic.
        codec: Recommendation codec in the configured framing.
        checkpointer: every record guards the offsets of its batch.
        metrics: events out and end-to-end latency.
    """

    def __init__(
        self,
        producer: Producer,
        topic: str,
        codec: RecordCodec,
        checkpointer: Checkpointer,
        metrics: Metrics,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._codec = codec
        self._checkpointer = checkpointer
        self._metrics = metrics

    def publish(
        self,
        event_ids: list[str],
        user_ids: npt.NDArray[np.int64],
        event_time_ms: npt.NDArray[np.int64],
        top_counts: npt.NDArray[np.int64],
        top_item_ids: npt.NDArray[np.int64],
        top_scores: npt.NDArray[np.float64],
        fallbacks: FallbackFlags,
        model_version: str,
        checkpoint: Checkpoint | None = None,
    ) -> npt.NDArray[np.float64]:
        """Produce one Recommendation per event.

        Args:
            event_ids, user_ids, event_time_ms: per event (E).
            top_counts: int64[E], items returned per event.
            top_item_ids, top_scores: flat, event-major, best first within each event.
            fallbacks: per-event fallback flags.
            model_version: of the model that scored the batch.
            checkpoint: the batch's checkpoint (default: the open one).

        Returns:
            float64[E] end-to-end latency of each event (event_time -> produced), seconds.
        """
        now_ms = int(time.time() * 1000)
        item_ids: list[int] = top_item_ids.tolist()
        scores: list[float] = top_scores.tolist()
        bounds = offsets(top_counts).tolist()
        encode = self._codec.encode
        for e, (event_id, user_id) in enumerate(zip(event_ids, user_ids.tolist(), strict=True)):
            lo, hi = bounds[e], bounds[e + 1]
            record = {
                "event_id": event_id,
                "user_id": user_id,
                "items": [
                    {"item_id": i, "score": s}
                    for i, s in zip(item_ids[lo:hi], scores[lo:hi], strict=True)
                ],
                "model_version": model_version,
                "scored_at": now_ms,
                "fallback_features": fallbacks.names(e),
            }
            produce(
                self._producer,
                self._topic,
                encode(record),
                key=str(user_id).encode(),
                on_delivery=self._checkpointer.delivery_callback(checkpoint),
            )
        self._metrics.events_out.inc(len(event_ids))
        latency_s: npt.NDArray[np.float64] = (now_ms - event_time_ms) / 1000.0
        for value in latency_s.tolist():
            self._metrics.end_to_end_seconds.observe(value)
        return latency_s
