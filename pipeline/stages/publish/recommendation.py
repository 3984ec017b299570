"""The built-in Recommendation (``schemas/recommendation.avsc``), encoded by its own compiled
kernel (:func:`pipeline.connectors.avro.kernels.encode_recommendations`).

Example::

    values = RecommendationEncoder(header).encode(events, scored, flags, now_ms)
"""

from __future__ import annotations

import itertools

import numpy as np

from model.features.segments import offsets
from pipeline.connectors.avro.kernels import encode_recommendations
from pipeline.stages.publish.flags import FALLBACK_NAMES, FALLBACK_OFFSETS, FallbackFlags
from pipeline.types import EventColumns, ScoredBatch

__all__ = ["RecommendationEncoder"]

_MAX_VARINT = 10


class RecommendationEncoder:
    """One built-in Recommendation per event.

    Args:
        header: what precedes each Avro body (the Confluent header of the registered
            Recommendation schema, or nothing in raw framing).
    """

    def __init__(self, header: bytes) -> None:
        self._header = np.frombuffer(header, dtype=np.uint8)

    def encode(
        self, events: EventColumns, scored: ScoredBatch, flags: FallbackFlags, now_ms: int
    ) -> list[bytes]:
        """The Recommendation of every event
        (:meth:`~pipeline.stages.publish.sink.RecordEncoder.encode`)."""
        n = events.num_events
        id_bytes, id_offsets = events.event_id_bytes, events.event_id_offsets
        version = np.frombuffer(scored.model_version.encode(), dtype=np.uint8)
        header = self._header
        per_event = len(header) + len(version) + 8 * _MAX_VARINT + 3 + len(FALLBACK_NAMES)
        capacity = len(id_bytes) + n * per_event
        capacity += len(scored.item_ids) * (_MAX_VARINT + 8)
        out = np.empty(capacity + 16, dtype=np.uint8)
        out_offsets = np.empty(n + 1, dtype=np.int64)
        encode_recommendations(
            header, id_bytes, id_offsets, events.user_ids.astype(np.int64, copy=False),
            offsets(scored.counts), scored.item_ids.astype(np.int64, copy=False),
            np.ascontiguousarray(scored.scores, dtype="<f8").view(np.uint8), version, now_ms,
            flags.user, flags.item, FALLBACK_NAMES, FALLBACK_OFFSETS,
            events.retrieved.astype(bool, copy=False), out, out_offsets,
        )  # fmt: skip
        return split_records(out, out_offsets)


def split_records(out: np.ndarray, out_offsets: np.ndarray) -> list[bytes]:
    """The records laid end to end in ``out``, one ``bytes`` each."""
    bounds = out_offsets.tolist()
    data = out[: bounds[-1]].tobytes()  # the records, not the buffer's spare room
    return [data[lo:hi] for lo, hi in itertools.pairwise(bounds)]
