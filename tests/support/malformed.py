"""Malformed input messages of every kind the decoder rejects, each with the reasons it may be
dead-lettered for (shared by the end-to-end and the ingest-worker DLQ tests)."""

from __future__ import annotations

from model.synthetic import SyntheticWorld
from pipeline.connectors.avro.reference import (
    RECOMMENDATION_SCHEMA_FILE,
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
)
from pipeline.settings.loading import Settings
from pipeline.types import RejectReason


def malformed_values(settings: Settings, world: SyntheticWorld) -> dict[bytes, set[str]]:
    """One malformed message per reject reason (for ``codec.max_message_bytes = 4096`` and
    ``max_candidates = 200``), and a Recommendation on the events topic (a wrong schema must
    not decode as a UserEvent).

    Returns:
        message value -> the reasons (``RejectReason`` values) it may be dead-lettered for.
    """
    events = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    recs = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, settings.topics.output)
    good = {
        "event_id": "template",
        "user_id": int(world.user_ids[0]),
        "event_time": 0,
        "context": {"device": "ios", "country": "US"},
        "candidate_item_ids": [int(i) for i in world.item_ids[:5]],
        "recent_item_ids": None,
        "num_results": 3,
    }
    bad = {
        RejectReason.UNDECODABLE: b"\x00\x01garbage\xff",
        RejectReason.EMPTY: b"",
        RejectReason.NO_CANDIDATES: events.encode({**good, "candidate_item_ids": []}),
        RejectReason.TOO_MANY_CANDIDATES: events.encode(
            {**good, "candidate_item_ids": list(range(300))}
        ),
        RejectReason.ID_OUT_OF_RANGE: events.encode({**good, "user_id": -5}),
        RejectReason.OVERSIZED: events.encode({**good, "recent_item_ids": [2**40] * 1000}),
        RejectReason.INVALID_FIELD: events.encode({**good, "num_results": 0}),
    }
    wrong_schema = recs.encode(
        {
            "event_id": "x",
            "user_id": 1,
            "items": [],
            "model_version": "m",
            "scored_at": 0,
            "fallback_features": [],
        }
    )
    values = {value: {reason.value} for reason, value in bad.items()}
    values[wrong_schema] = {RejectReason.UNDECODABLE.value, RejectReason.SCHEMA_MISMATCH.value}
    return values
