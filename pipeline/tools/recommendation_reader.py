"""Reading topics back: raw messages, and decoded Recommendations for ``streamrank consume``,
the benchmarks and tests."""

from __future__ import annotations

import datetime
import decimal
import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Message

from pipeline.connectors.avro.reference import (
    RECOMMENDATION_SCHEMA_FILE,
    RECOMMENDATION_V1_SCHEMA_FILE,
    RecordCodec,
)
from pipeline.connectors.avro.rules import epoch_millis
from pipeline.connectors.kafka.clients import make_consumer
from pipeline.settings.loading import Settings


def read_messages(
    settings: Settings,
    topic: str,
    *,
    max_records: int | None = None,
    timeout_s: float = 10.0,
    group_id: str | None = None,
    from_beginning: bool = True,
) -> Iterator[Message]:
    """Yield the messages of ``topic`` until ``max_records`` or ``timeout_s`` without one.

    Args:
        settings: the cluster.
        topic: what to read.
        max_records: stop after this many (``None``: until idle).
        timeout_s: stop after this long without a new message.
        group_id: consumer group (default: a throw-away one, nothing committed).
        from_beginning: start at the earliest offset for a new group.

    Yields:
        Messages that carry data (client errors are skipped), in each partition's order.

    Example::

        for message in read_messages(settings, settings.topics.input, timeout_s=2):
            message.timestamp()
    """
    consumer = make_consumer(
        settings.kafka.config,
        group_id=group_id or f"streamrank-consume-{uuid.uuid4().hex[:8]}",
        extra={"auto.offset.reset": "earliest" if from_beginning else "latest"},
    )
    consumer.subscribe([topic])
    seen = 0
    last = time.monotonic()
    try:
        while max_records is None or seen < max_records:
            messages = consumer.consume(500, 0.2)
            if not messages:
                if time.monotonic() - last >= timeout_s:
                    return
                continue
            last = time.monotonic()
            for msg in messages:
                if msg.error() is not None:
                    continue
                yield msg
                seen += 1
                if max_records is not None and seen >= max_records:
                    return
    finally:
        consumer.close()


def recommendation_codec(settings: Settings) -> RecordCodec:
    """The codec readers of the output topic use: the user's output schema (``[output]``), or
    the current Recommendation schema and the previous one for records written before it (raw
    framing)."""
    own = settings.output.schema_file
    if own is not None:
        return RecordCodec(settings.codec, own, settings.topics.output)
    return RecordCodec(
        settings.codec,
        RECOMMENDATION_SCHEMA_FILE,
        settings.topics.output,
        previous=[RECOMMENDATION_V1_SCHEMA_FILE],
    )


def json_ready(value: Any) -> Any:
    """A decoded record with what JSON cannot hold made plain: times (fastavro's datetimes of
    ``timestamp-*``) as epoch milliseconds, dates and times of day as ISO text, bytes as
    Latin-1 text (Avro's JSON encoding), decimals and UUIDs as text."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_ready(v) for v in value]
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:  # local-timestamp-*: the wall clock, read as if UTC
            value = value.replace(tzinfo=datetime.UTC)
        return epoch_millis(value)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    return value


def read_recommendations(
    settings: Settings,
    *,
    max_records: int | None = None,
    timeout_s: float = 10.0,
    group_id: str | None = None,
    from_beginning: bool = True,
) -> Iterator[dict[str, Any]]:
    """Yield Recommendations from ``topics.output`` until ``max_records`` or ``timeout_s`` idle.

    Args:
        settings: cluster, topic and framing.
        max_records: stop after this many (``None``: until idle).
        timeout_s: stop after this long without a new record.
        group_id: consumer group (default: a throw-away one, nothing committed).
        from_beginning: start at the earliest offset for a new group.

    Yields:
        Decoded records; ``scored_at`` is epoch milliseconds. Records written before the
        schema gained ``retrieved`` read as ``retrieved = False`` (in raw framing they are
        decoded with the previous schema, ``schemas/v1``; in Confluent framing the registry
        resolves them). With an output schema of the user's (``[output]``), its records,
        made ready for JSON (:func:`json_ready`: times as epoch milliseconds).
    """
    codec = recommendation_codec(settings)
    own = settings.output.configured
    for msg in read_messages(
        settings,
        settings.topics.output,
        max_records=max_records,
        timeout_s=timeout_s,
        group_id=group_id,
        from_beginning=from_beginning,
    ):
        record = codec.decode(msg.value() or b"")
        if own:
            yield json_ready(record)
            continue
        scored_at = record["scored_at"]
        if not isinstance(scored_at, int):
            record["scored_at"] = epoch_millis(scored_at)
        yield record
