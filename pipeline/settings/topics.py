"""The ``[topics]`` section: topic names, and how to create missing topics."""

from __future__ import annotations

from pipeline.settings.section import Section

RECORD_OVERHEAD_BYTES = 4096
"""Room for a record's framing around its value (batch header, key, headers): the input topic's
``max.message.bytes`` holds ``codec.max_message_bytes`` plus this."""


class TopicsSettings(Section):
    """Topic names, and how to create them when missing."""

    input: str = "user-events"
    output: str = "recommendations"
    dlq: str = "user-events-dlq"
    create_missing: bool = True
    partitions: int = 4
    replication_factor: int = 1
    input_max_message_bytes: int = 1_048_588
    """The input topic's ``max.message.bytes`` when streamrank creates it: the largest record
    batch the broker accepts on it, so the largest record the consumer takes in (Kafka's
    default). At least ``codec.max_message_bytes`` plus 4 KiB of framing, so that a value just
    over the codec's limit is dead-lettered by the pipeline, not refused at the producer; at
    most what your producers' batches need (librdkafka producers batch up to 1,000,000 bytes
    and do not split a batch the broker refuses)."""
