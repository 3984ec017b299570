"""The ``[codec]`` section: the wire format of events and recommendations, and the limits
that reject bad input."""

from __future__ import annotations

import enum

from pydantic import Field, model_validator

from pipeline.settings.section import Section


class Framing(enum.StrEnum):
    """How Avro records are framed in Kafka message values."""

    RAW = "raw"
    """Schemaless Avro; both sides use the schema files in ``schemas/``."""
    CONFLUENT = "confluent"
    """Confluent wire format: magic byte 0, 4-byte big-endian schema id, Avro body."""


class CodecSettings(Section):
    """Wire format of events and recommendations, and the limits that reject bad input."""

    framing: Framing = Framing.RAW
    schema_registry_url: str | None = None
    schema_registry_extra: dict[str, str] = Field(default_factory=dict)
    max_message_bytes: int = 64 * 1024
    max_candidates: int = 1000
    max_id: int = 2**63 - 1
    """Ids (user, item) must lie in ``[0, max_id]``."""
    max_num_results: int = 1000
    max_recent_items: int = 1000
    """More ``recent_item_ids`` than this is rejected (up to it they are truncated to the
    model's cap)."""
    max_string_length: int = 256
    """``event_id``, ``context.device`` and ``context.country``: 1 to this many characters."""
    max_event_time_ahead_s: float = 3600.0
    """``event_time`` later than now plus this is rejected; one before 1973-03-03 too (seconds sent
    as milliseconds)."""

    @model_validator(mode="after")
    def _registry_for_confluent(self) -> CodecSettings:
        if self.framing is Framing.CONFLUENT and not self.schema_registry_url:
            raise ValueError(
                'codec.framing = "confluent" needs codec.schema_registry_url (the schema '
                'registry\'s base URL, e.g. "http://registry:8081"), or framing = "raw"'
            )
        return self
