"""The fastavro reference codec: Kafka message bytes <-> UserEvent / Recommendation records.

The decode stage (:mod:`pipeline.stages.decode`) decodes with compiled kernels and asks this
codec only about the exceptions (a rejected message's reason and detail; a Confluent writer
schema other than ours). Tools and tests encode and decode records with :class:`RecordCodec`.

Two framings (``codec.framing``):

- ``raw``: schemaless Avro, both sides use the schema files in ``schemas/``.
- ``confluent``: the Confluent wire format (magic byte ``0``, 4-byte big-endian schema id, Avro
  body). Writer schemas are looked up by id through ``confluent_kafka.schema_registry`` and
  resolved against our reader schema, so compatible schema evolution just works.

:class:`ReferenceDecoder` also *validates* (the rules of :mod:`pipeline.connectors.avro.rules`):
anything the pipeline cannot score raises :class:`~pipeline.types.RejectedMessage` with its reason.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
from fastavro.schema import SchemaParseException
from fastavro.types import Schema

from model.features.spec import string_to_id
from pipeline.connectors.avro import framing as wire
from pipeline.connectors.avro.rules import EARLIEST_EVENT_MS, Limits, epoch_millis
from pipeline.connectors.avro.schema_registry import SchemaLookup, UnknownSchemaId, load_schema
from pipeline.settings.codec import CodecSettings, Framing
from pipeline.types import EventColumns, RejectedMessage, RejectReason

log = logging.getLogger(__name__)

SCHEMA_DIR = Path(__file__).resolve().parents[3] / "schemas"
USER_EVENT_SCHEMA_FILE = SCHEMA_DIR / "user_event.avsc"
RECOMMENDATION_SCHEMA_FILE = SCHEMA_DIR / "recommendation.avsc"
RECOMMENDATION_V1_SCHEMA_FILE = SCHEMA_DIR / "v1" / "recommendation.avsc"
"""The Recommendation before ``retrieved`` (raw-framing readers decode older records with it)."""

Record = dict[str, Any]
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


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
            self._header = wire.header(self._lookup.register(subject, schema_path))

    def read(self, value: bytes) -> Record:
        """Decode one body; raises :class:`RejectedMessage` on anything malformed."""
        writer_schema = self.reader_schema
        start = 0
        if self.framing is Framing.CONFLUENT:
            schema_id = wire.schema_id(value)
            if schema_id is None:
                raise RejectedMessage(
                    RejectReason.BAD_FRAMING,
                    "expected Confluent wire format (magic byte 0 + 4-byte schema id)",
                )
            assert self._lookup is not None
            try:
                writer_schema = self._lookup.writer_schema(schema_id)
            except (UnknownSchemaId, ValueError, SchemaParseException) as exc:  # 404 or bad text
                raise RejectedMessage(
                    RejectReason.UNKNOWN_SCHEMA, f"schema id {schema_id}: {exc}"
                ) from exc
            start = wire.HEADER_BYTES
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


def make_framing(settings: CodecSettings, schema_path: Path) -> AvroFraming:
    """The framing of ``settings`` for records of the schema file at ``schema_path`` (the
    registry's lookup made when the framing is Confluent's)."""
    lookup = None
    if settings.framing is Framing.CONFLUENT:
        if not settings.schema_registry_url:
            raise ValueError("codec.framing = 'confluent' needs codec.schema_registry_url")
        lookup = SchemaLookup(settings.schema_registry_url, settings.schema_registry_extra)
    return AvroFraming(settings.framing, load_schema(schema_path), lookup)


class ReferenceDecoder:
    """Bytes -> validated UserEvent record, with fastavro: the reference for the kernels.

    Applies the rules of :mod:`pipeline.connectors.avro.rules` in their order; each failure is a
    :class:`~pipeline.types.RejectedMessage`. ``recent_item_ids`` longer than the cap is
    truncated (newest first are kept), never rejected; ``None`` becomes ``[]``.

    Args:
        settings: framing, registry and the ``codec.*`` limits.
        recent_cap: the served model's ``recent_items_cap``.
        retrieve: an empty ``candidate_item_ids`` is valid (``retrieval.enabled``).

    Example::

        decoder = ReferenceDecoder(CodecSettings(), recent_cap=20)
        event = decoder.decode(message.value())
    """

    def __init__(self, settings: CodecSettings, recent_cap: int, retrieve: bool = False) -> None:
        self.limits = Limits.from_settings(settings, recent_cap, retrieve)
        self._framing = make_framing(settings, USER_EVENT_SCHEMA_FILE)
        self.writer_is_reader = self._framing.writer_is_reader

    def decode(self, value: bytes | None) -> Record:
        """Decode and validate one message value.

        Raises:
            RejectedMessage: the first rule it breaks.
        """
        limits = self.limits
        if not value:
            raise RejectedMessage(RejectReason.EMPTY, "message value is empty or null")
        if len(value) > limits.max_message_bytes:
            raise RejectedMessage(
                RejectReason.OVERSIZED,
                f"{len(value)} bytes > codec.max_message_bytes={limits.max_message_bytes}",
            )
        event = self._framing.read(value)
        if not _INT_MIN <= event["num_results"] <= _INT_MAX:  # fastavro does not check ``int``
            raise RejectedMessage(
                RejectReason.UNDECODABLE, f"num_results {event['num_results']} is not a 32-bit int"
            )
        candidates = event["candidate_item_ids"]
        if not candidates and not limits.retrieve:
            raise RejectedMessage(
                RejectReason.NO_CANDIDATES,
                "candidate_item_ids is empty (and retrieval.enabled is false)",
            )
        if len(candidates) > limits.max_candidates:
            raise RejectedMessage(
                RejectReason.TOO_MANY_CANDIDATES,
                f"{len(candidates)} candidates > codec.max_candidates={limits.max_candidates}",
            )
        recent = event["recent_item_ids"] or []
        if len(recent) > limits.max_recent_items:
            raise RejectedMessage(
                RejectReason.TOO_MANY_RECENT_ITEMS,
                f"{len(recent)} recent items > codec.max_recent_items={limits.max_recent_items}",
            )
        event["recent_item_ids"] = recent = recent[: limits.recent_cap]
        max_id = limits.max_id
        user_id = event["user_id"]
        if not 0 <= user_id <= max_id:
            raise RejectedMessage(
                RejectReason.ID_OUT_OF_RANGE, f"user_id {user_id} not in [0, {max_id}]"
            )
        ids = candidates + recent
        low, high = (min(ids), max(ids)) if ids else (0, 0)
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
        event_ms = epoch_millis(event["event_time"])
        if not EARLIEST_EVENT_MS <= event_ms <= limits.latest_event_ms():
            raise RejectedMessage(
                RejectReason.INVALID_EVENT_TIME,
                f"event_time {event_ms} ms is before 1973 (seconds, not milliseconds?) or more "
                f"than {limits.max_event_time_ahead_s:.0f}s ahead",
            )
        return event


def records_to_columns(records: list[Record]) -> EventColumns:
    """Decoded UserEvent records as :class:`~pipeline.types.EventColumns` (the reference's
    output in the decode stage's layout; one pass per field).

    Example::

        columns = records_to_columns([decoder.decode(v) for v in values])
    """
    n = len(records)
    ids = [r["event_id"].encode() for r in records]
    counts = np.fromiter((len(r["candidate_item_ids"]) for r in records), np.int64, n)
    recent_counts = np.fromiter((len(r["recent_item_ids"]) for r in records), np.int64, n)
    return EventColumns(
        event_id_bytes=np.frombuffer(b"".join(ids), dtype=np.uint8).copy(),
        event_id_offsets=np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64),
        user_ids=np.fromiter((r["user_id"] for r in records), np.int64, n),
        event_time_ms=np.fromiter((epoch_millis(r["event_time"]) for r in records), np.int64, n),
        device_ids=np.fromiter(
            (string_to_id(r["context"]["device"]) for r in records), np.int64, n
        ),
        country_ids=np.fromiter(
            (string_to_id(r["context"]["country"]) for r in records), np.int64, n
        ),
        num_results=np.fromiter((r["num_results"] for r in records), np.int64, n),
        candidate_counts=counts,
        candidate_ids=np.fromiter(
            (i for r in records for i in r["candidate_item_ids"]), np.int64, int(counts.sum())
        ),
        recent_counts=recent_counts,
        recent_ids=np.fromiter(
            (i for r in records for i in r["recent_item_ids"]), np.int64, int(recent_counts.sum())
        ),
        retrieved=np.zeros(n, dtype=bool),
    )


class RecordCodec:
    """Encode/decode records of one schema on one topic, without validation.

    Used for the recommendations the pipeline writes, and by ``produce``/``consume`` and tests.
    In Confluent framing the schema is registered under the subject ``<topic>-value``, and
    records written with an older schema are resolved through the registry.

    Args:
        settings: framing and registry.
        schema_path: the schema records are written with and decoded into.
        topic: the topic (Confluent framing: the registry subject).
        previous: older versions of the schema (raw framing, where the bytes do not say which
            schema wrote them): a record that does not decode with ``schema_path`` is decoded
            with each of them as the writer schema, resolved into ``schema_path`` (added
            fields get their defaults).

    Example::

        codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, "recommendations")
        value = codec.encode(record)
        old = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, "recommendations",
                          previous=[RECOMMENDATION_V1_SCHEMA_FILE])
        old.decode(value_written_before_retrieval)["retrieved"]  # False
    """

    def __init__(
        self,
        settings: CodecSettings,
        schema_path: Path,
        topic: str,
        previous: Sequence[Path] = (),
    ) -> None:
        self._framing = make_framing(settings, schema_path)
        self._framing.bind_writer(f"{topic}-value", schema_path)
        self.encode: Callable[[Record], bytes] = self._framing.write
        self.header: bytes = self._framing.header
        self._previous = (
            [load_schema(p) for p in previous] if settings.framing is Framing.RAW else []
        )

    def decode(self, value: bytes) -> Record:
        """One record (the current schema's fields; a record of a ``previous`` schema with the
        added fields' defaults).

        Raises:
            RejectedMessage: it decodes with none of the schemas.
        """
        try:
            return self._framing.read(value)
        except RejectedMessage as failed:
            for writer in self._previous:
                try:
                    return _read_exactly(value, writer, self._framing.reader_schema)
                except Exception:
                    continue
            raise failed from None


def _read_exactly(value: bytes, writer: Schema, reader: Schema) -> Record:
    """``value`` decoded with ``writer`` resolved into ``reader``, every byte read."""
    buf = io.BytesIO(value)
    record = fastavro.schemaless_reader(buf, writer, reader)
    if buf.tell() != len(value) or not isinstance(record, dict):
        raise ValueError("not a whole record of this schema")
    return record
