"""Avro codec: Kafka message bytes <-> UserEvent / Recommendation records.

Two framings (``codec.framing``):

- ``raw``: schemaless Avro, both sides use the schema files in ``schemas/``.
- ``confluent``: the Confluent wire format (magic byte ``0``, 4-byte big-endian schema id, Avro
  body). Writer schemas are looked up by id through ``confluent_kafka.schema_registry`` and
  resolved against our reader schema, so compatible schema evolution just works.

Decoding also *validates*: anything the pipeline cannot score raises :class:`RejectedMessage`
with a machine-readable reason, which the caller routes to the dead-letter topic.
"""

from __future__ import annotations

import datetime
import enum
import io
import logging
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException
from fastavro.types import Schema

from pipeline.config import CodecSettings, Framing
from pipeline.stages.schema_registry import (
    SchemaLookup,
    UnknownSchemaId,
    load_schema,
)

log = logging.getLogger(__name__)

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"
USER_EVENT_SCHEMA_FILE = SCHEMA_DIR / "user_event.avsc"
RECOMMENDATION_SCHEMA_FILE = SCHEMA_DIR / "recommendation.avsc"

_CONFLUENT_MAGIC = 0
_CONFLUENT_HEADER = struct.Struct(">bI")

Record = dict[str, Any]


class RejectReason(enum.StrEnum):
    """Why a message went to the dead-letter topic (the ``x-dlq-reason`` header)."""

    EMPTY = "empty_value"
    OVERSIZED = "oversized_message"
    UNDECODABLE = "undecodable"
    BAD_FRAMING = "bad_framing"
    UNKNOWN_SCHEMA = "unknown_schema"
    SCHEMA_MISMATCH = "schema_mismatch"
    NO_CANDIDATES = "no_candidates"
    TOO_MANY_CANDIDATES = "too_many_candidates"
    ID_OUT_OF_RANGE = "id_out_of_range"
    INVALID_FIELD = "invalid_field"
    TOO_MANY_RECENT_ITEMS = "too_many_recent_items"
    INVALID_STRING = "invalid_string"
    INVALID_EVENT_TIME = "invalid_event_time"
    PROCESSING_ERROR = "processing_error"
    """Decoded and valid, but a step after decode (enrich, features, forward, top-K, encode)
    fails for this event alone (:mod:`pipeline.stages.isolate`)."""


class RejectedMessage(Exception):
    """A message that cannot be scored. ``reason`` is stable; ``detail`` is for humans."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


class AvroFraming:
    """Reads and writes Avro bodies in the configured framing.

    Args:
        framing: raw schemaless or Confluent wire format.
        reader_schema: the schema records are decoded into (our ``.avsc``).
        schema_lookup: required for ``Framing.CONFLUENT``.
    """

    def __init__(
        self, framing: Framing, reader_schema: Schema, schema_lookup: SchemaLookup | None = None
    ) -> None:
        if framing is Framing.CONFLUENT and schema_lookup is None:
            raise ValueError("codec.framing = 'confluent' needs codec.schema_registry_url")
        self.framing = framing
        self.reader_schema = reader_schema
        self._lookup = schema_lookup
        self._header = b""

    def bind_writer(self, subject: str, schema_path: Path) -> None:
        """For encoding in Confluent framing: register the schema and remember its header."""
        if self.framing is Framing.CONFLUENT:
            assert self._lookup is not None
            self._header = _CONFLUENT_HEADER.pack(
                _CONFLUENT_MAGIC, self._lookup.register(subject, schema_path)
            )

    def read(self, value: bytes) -> Record:
        """Decode one body; raises :class:`RejectedMessage` on anything malformed."""
        writer_schema = self.reader_schema
        start = 0
        if self.framing is Framing.CONFLUENT:
            if len(value) < _CONFLUENT_HEADER.size or value[0] != _CONFLUENT_MAGIC:
                raise RejectedMessage(
                    RejectReason.BAD_FRAMING,
                    "expected Confluent wire format (magic byte 0 + 4-byte schema id)",
                )
            _, schema_id = _CONFLUENT_HEADER.unpack_from(value)
            assert self._lookup is not None
            try:
                writer_schema = self._lookup.writer_schema(schema_id)
            except (UnknownSchemaId, ValueError, SchemaParseException) as exc:  # 404 or bad text
                raise RejectedMessage(
                    RejectReason.UNKNOWN_SCHEMA, f"schema id {schema_id}: {exc}"
                ) from exc
            start = _CONFLUENT_HEADER.size
        buf = io.BytesIO(value)
        buf.seek(start)
        try:
            record = fastavro.schemaless_reader(buf, writer_schema, self.reader_schema)
        except fastavro.read.SchemaResolutionError as exc:
            raise RejectedMessage(RejectReason.SCHEMA_MISMATCH, str(exc)) from exc
        except Exception as exc:
            raise RejectedMessage(RejectReason.UNDECODABLE, f"{type(exc).__name__}: {exc}") from exc
        if buf.tell() != len(value):
            raise RejectedMessage(
                RejectReason.UNDECODABLE,
                f"{len(value) - buf.tell()} trailing bytes after the record "
                "(written with another schema?)",
            )
        if not isinstance(record, dict):
            raise RejectedMessage(RejectReason.SCHEMA_MISMATCH, "body is not a record")
        return record

    @property
    def header(self) -> bytes:
        """What :meth:`write` puts before each body (the Confluent header, or nothing)."""
        return self._header

    def writer_is_reader(self, schema_id: int) -> bool:
        """Whether the registry's schema ``schema_id`` is our reader schema (False if unknown)."""
        if self._lookup is None:
            return False
        try:
            return self._lookup.writer_schema(schema_id) == self.reader_schema
        except Exception:  # unknown id: decoding rejects it with UNKNOWN_SCHEMA
            return False

    def write(self, record: Record) -> bytes:
        """Encode one record (with the Confluent header when so framed)."""
        buf = io.BytesIO()
        buf.write(self._header)
        fastavro.schemaless_writer(buf, self.reader_schema, record)
        return buf.getvalue()


def _make_framing(settings: CodecSettings, schema_path: Path) -> AvroFraming:
    lookup = None
    if settings.framing is Framing.CONFLUENT:
        if not settings.schema_registry_url:
            raise ValueError("codec.framing = 'confluent' needs codec.schema_registry_url")
        lookup = SchemaLookup(settings.schema_registry_url, settings.schema_registry_extra)
    return AvroFraming(settings.framing, load_schema(schema_path), lookup)


class UserEventDecoder:
    """Bytes -> validated UserEvent record.

    Validation rules (each failure is a :class:`RejectedMessage`):

    - the value is present, non-empty and at most ``max_message_bytes``;
    - it decodes with the UserEvent schema and nothing is left over;
    - there is at least one candidate and at most ``max_candidates``;
    - ``user_id`` and every item id lie in ``[0, max_id]``;
    - ``1 <= num_results <= max_num_results``;
    - at most ``max_recent_items`` recent items;
    - ``event_id``, ``context.device`` and ``context.country`` hold 1 to
      ``max_string_length`` characters;
    - ``event_time`` lies between 10^11 ms (1973-03-03; any epoch-seconds value is below it) and
      ``max_event_time_ahead_s`` from now.

    ``recent_item_ids`` longer than ``recent_cap`` is truncated (newest first are kept), never
    rejected; ``None`` becomes ``[]``.

    Example::

        decoder = UserEventDecoder(CodecSettings(), recent_cap=20)
        event = decoder.decode(message.value())
    """

    def __init__(self, settings: CodecSettings, recent_cap: int) -> None:
        self._settings = settings
        self._recent_cap = recent_cap
        self._framing = _make_framing(settings, USER_EVENT_SCHEMA_FILE)
        self.writer_is_reader = self._framing.writer_is_reader

    def decode(self, value: bytes | None) -> Record:
        limits = self._settings
        if not value:
            raise RejectedMessage(RejectReason.EMPTY, "message value is empty or null")
        if len(value) > limits.max_message_bytes:
            raise RejectedMessage(
                RejectReason.OVERSIZED,
                f"{len(value)} bytes > codec.max_message_bytes={limits.max_message_bytes}",
            )
        event = self._framing.read(value)
        candidates = event["candidate_item_ids"]
        if not candidates:
            raise RejectedMessage(RejectReason.NO_CANDIDATES, "candidate_item_ids is empty")
        if len(candidates) > limits.max_candidates:
            raise RejectedMessage(
                RejectReason.TOO_MANY_CANDIDATES,
                f"{len(candidates)} candidates > codec.max_candidates={limits.max_candidates}",
            )
        recent = event["recent_item_ids"]
        if recent is not None and len(recent) > limits.max_recent_items:
            raise RejectedMessage(
                RejectReason.TOO_MANY_RECENT_ITEMS,
                f"{len(recent)} recent items > codec.max_recent_items={limits.max_recent_items}",
            )
        if recent is None:
            event["recent_item_ids"] = recent = []
        elif len(recent) > self._recent_cap:
            event["recent_item_ids"] = recent = recent[: self._recent_cap]
        max_id = limits.max_id
        user_id = event["user_id"]
        if not 0 <= user_id <= max_id:
            raise RejectedMessage(
                RejectReason.ID_OUT_OF_RANGE, f"user_id {user_id} not in [0, {max_id}]"
            )
        low, high = min(candidates), max(candidates)
        if recent:
            low, high = min(low, min(recent)), max(high, max(recent))
        if low < 0 or high > max_id:
            bad = low if low < 0 else high
            raise RejectedMessage(
                RejectReason.ID_OUT_OF_RANGE, f"item id {bad} not in [0, {max_id}]"
            )
        num_results = event["num_results"]
        if not 1 <= num_results <= limits.max_num_results:
            raise RejectedMessage(
                RejectReason.INVALID_FIELD,
                f"num_results {num_results} not in [1, {limits.max_num_results}]",
            )
        context = event["context"]
        for name, text in (
            ("event_id", event["event_id"]),
            ("context.device", context["device"]),
            ("context.country", context["country"]),
        ):
            if not 0 < len(text) <= limits.max_string_length:
                raise RejectedMessage(
                    RejectReason.INVALID_STRING,
                    f"{name} has {len(text)} characters, not in [1, {limits.max_string_length}]",
                )
        event_ms = _epoch_ms(event["event_time"])
        if not EARLIEST_EVENT_MS <= event_ms <= latest_event_ms(limits):
            raise RejectedMessage(
                RejectReason.INVALID_EVENT_TIME,
                f"event_time {event_ms} ms is before 1973 (seconds, not milliseconds?) or more "
                f"than {limits.max_event_time_ahead_s:.0f}s ahead",
            )
        return event


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
EARLIEST_EVENT_MS = 100_000_000_000
"""1973-03-03: an ``event_time`` before it was most likely sent in seconds (epoch seconds stay
below it until the year 5138)."""


def latest_event_ms(limits: CodecSettings) -> int:
    """The latest ``event_time`` accepted now: ``codec.max_event_time_ahead_s`` from now."""
    return int(time.time() * 1000 + limits.max_event_time_ahead_s * 1000)


def _epoch_ms(value: int | datetime.datetime) -> int:
    """fastavro decodes timestamp-millis to an aware datetime (an int when written raw)."""
    if isinstance(value, int):
        return value
    return (value - _EPOCH) // datetime.timedelta(milliseconds=1)


class RecordCodec:
    """Encode/decode records of one schema on one topic, without validation.

    Used for the recommendations the pipeline writes, and by ``produce``/``consume`` and tests.
    In Confluent framing the schema is registered under the subject ``<topic>-value``.

    Example::

        codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, "recommendations")
        value = codec.encode(record)
    """

    def __init__(self, settings: CodecSettings, schema_path: Path, topic: str) -> None:
        self._framing = _make_framing(settings, schema_path)
        self._framing.bind_writer(f"{topic}-value", schema_path)
        self.encode: Callable[[Record], bytes] = self._framing.write
        self.header: bytes = self._framing.header
        self.decode: Callable[[bytes], Record] = self._framing.read
