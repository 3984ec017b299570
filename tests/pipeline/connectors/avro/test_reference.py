"""ReferenceDecoder / RecordCodec: round trips, every reject reason, Confluent framing."""

from __future__ import annotations

import datetime as dt
import io
import json
import struct
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pytest

from pipeline.connectors.avro.reference import (
    RECOMMENDATION_SCHEMA_FILE,
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
    ReferenceDecoder,
)
from pipeline.connectors.avro.schema_registry import SchemaLookup
from pipeline.settings.codec import CodecSettings, Framing
from pipeline.types import RejectedMessage, RejectReason

RECENT_CAP = 5

EventFactory = Callable[..., dict[str, Any]]


def _encoder(settings: CodecSettings | None = None) -> RecordCodec:
    return RecordCodec(settings or CodecSettings(), USER_EVENT_SCHEMA_FILE, "user-events")


def _decoder(
    settings: CodecSettings | None = None, recent_cap: int = RECENT_CAP
) -> ReferenceDecoder:
    return ReferenceDecoder(settings or CodecSettings(), recent_cap=recent_cap)


def _reject(decoder: ReferenceDecoder, value: bytes | None) -> RejectedMessage:
    with pytest.raises(RejectedMessage) as info:
        decoder.decode(value)
    return info.value


def _recommendation() -> dict[str, Any]:
    return {
        "event_id": "e-1",
        "user_id": 42,
        "items": [{"item_id": 101, "score": 0.75}, {"item_id": 102, "score": 0.5}],
        "model_version": "v1",
        "scored_at": dt.datetime(2024, 5, 17, 12, 0, tzinfo=dt.UTC),
        "fallback_features": ["user_features"],
        "retrieved": True,
    }


# ------------------------------------------------------------------------------ raw framing --


class TestRawRoundTrip:
    def test_valid_event_round_trips_unchanged(self, make_event: EventFactory) -> None:
        event = make_event()
        decoded = _decoder().decode(_encoder().encode(event))
        assert decoded == event
        assert decoded["event_time"].tzinfo is not None

    def test_many_distinct_events_round_trip(self, make_event: EventFactory) -> None:
        encoder, decoder = _encoder(), _decoder()
        for i in range(20):
            event = make_event(
                event_id=f"e{i}",
                user_id=i * 1_000_003,
                candidate_item_ids=list(range(i, 2 * i + 1)),
                recent_item_ids=list(range(i % RECENT_CAP)),
                num_results=i + 1,
                context={"device": f"d{i}", "country": "ünïcode-ß"},
            )
            assert decoder.decode(encoder.encode(event)) == event

    def test_null_recent_items_become_empty_list(self, make_event: EventFactory) -> None:
        decoded = _decoder().decode(_encoder().encode(make_event(recent_item_ids=None)))
        assert decoded["recent_item_ids"] == []

    def test_optional_fields_take_schema_defaults(self, make_event: EventFactory) -> None:
        event = make_event()
        del event["recent_item_ids"], event["num_results"]
        decoded = _decoder().decode(_encoder().encode(event))
        assert decoded["recent_item_ids"] == []
        assert decoded["num_results"] == 10

    def test_recent_items_truncated_to_cap_not_rejected(self, make_event: EventFactory) -> None:
        recent = [900 + i for i in range(RECENT_CAP + 7)]
        decoded = _decoder().decode(_encoder().encode(make_event(recent_item_ids=recent)))
        assert decoded["recent_item_ids"] == recent[:RECENT_CAP]  # newest first are kept

    def test_recent_items_at_cap_kept_whole(self, make_event: EventFactory) -> None:
        recent = list(range(RECENT_CAP))
        decoded = _decoder().decode(_encoder().encode(make_event(recent_item_ids=recent)))
        assert decoded["recent_item_ids"] == recent

    def test_recommendation_codec_round_trip(self) -> None:
        codec = RecordCodec(CodecSettings(), RECOMMENDATION_SCHEMA_FILE, "recs")
        record = _recommendation()
        assert codec.decode(codec.encode(record)) == record


# ----------------------------------------------------------------------------- reject paths --


class TestRejectReasons:
    @pytest.mark.parametrize("value", [None, b""])
    def test_empty_or_null_value(self, value: bytes | None) -> None:
        assert _reject(_decoder(), value).reason is RejectReason.EMPTY

    def test_oversized_message(self, make_event: EventFactory) -> None:
        value = _encoder().encode(make_event())
        at_limit = _decoder(CodecSettings(max_message_bytes=len(value)))
        assert at_limit.decode(value)["user_id"] == 42
        too_small = _decoder(CodecSettings(max_message_bytes=len(value) - 1))
        rejected = _reject(too_small, value)
        assert rejected.reason is RejectReason.OVERSIZED
        assert str(len(value)) in rejected.detail

    def test_oversized_checked_before_decoding(self) -> None:
        garbage = b"\xff" * 100
        rejected = _reject(_decoder(CodecSettings(max_message_bytes=99)), garbage)
        assert rejected.reason is RejectReason.OVERSIZED

    @pytest.mark.parametrize(
        "value",
        [b"\xff" * 50, b"\x00", b"garbage!", bytes(range(256)), b"\x02\xc3\x28" + b"\x00" * 20],
        ids=["ff", "zero", "ascii", "all-bytes", "bad-utf8"],
    )
    def test_garbage_bytes_undecodable(self, value: bytes) -> None:
        assert _reject(_decoder(), value).reason is RejectReason.UNDECODABLE

    def test_random_bytes_never_escape_as_other_exceptions(self) -> None:
        import random

        rng = random.Random(1234)
        decoder = _decoder()
        for _ in range(300):
            value = rng.randbytes(rng.randrange(1, 120))
            try:
                decoder.decode(value)
            except RejectedMessage as exc:
                assert isinstance(exc.reason, RejectReason)

    def test_record_of_another_schema_undecodable(self) -> None:
        value = RecordCodec(CodecSettings(), RECOMMENDATION_SCHEMA_FILE, "recs").encode(
            _recommendation()
        )
        assert _reject(_decoder(), value).reason is RejectReason.UNDECODABLE

    @pytest.mark.parametrize("cut", [1, 3, 10])
    def test_truncated_record_undecodable(self, make_event: EventFactory, cut: int) -> None:
        value = _encoder().encode(make_event())
        assert _reject(_decoder(), value[:-cut]).reason is RejectReason.UNDECODABLE

    @pytest.mark.parametrize("extra", [b"\x00", b"xyz"])
    def test_trailing_bytes_undecodable(self, make_event: EventFactory, extra: bytes) -> None:
        value = _encoder().encode(make_event()) + extra
        rejected = _reject(_decoder(), value)
        assert rejected.reason is RejectReason.UNDECODABLE
        assert "trailing" in rejected.detail

    def test_no_candidates(self, make_event: EventFactory) -> None:
        value = _encoder().encode(make_event(candidate_item_ids=[]))
        assert _reject(_decoder(), value).reason is RejectReason.NO_CANDIDATES
        retrieving = ReferenceDecoder(CodecSettings(), recent_cap=20, retrieve=True)
        assert retrieving.decode(value)["candidate_item_ids"] == []  # asks for retrieval

    def test_too_many_candidates(self, make_event: EventFactory) -> None:
        settings = CodecSettings(max_candidates=4)
        ok = _encoder().encode(make_event(candidate_item_ids=[1, 2, 3, 4]))
        assert _decoder(settings).decode(ok)["candidate_item_ids"] == [1, 2, 3, 4]
        too_many = _encoder().encode(make_event(candidate_item_ids=[1, 2, 3, 4, 5]))
        assert _reject(_decoder(settings), too_many).reason is RejectReason.TOO_MANY_CANDIDATES

    @pytest.mark.parametrize("user_id", [-1, -(2**63)])
    def test_negative_user_id(self, make_event: EventFactory, user_id: int) -> None:
        value = _encoder().encode(make_event(user_id=user_id))
        rejected = _reject(_decoder(), value)
        assert rejected.reason is RejectReason.ID_OUT_OF_RANGE
        assert "user_id" in rejected.detail

    @pytest.mark.parametrize(
        ("candidates", "recent"),
        [([1, -5, 3], [7]), ([-1], None), ([1, 2], [3, -2]), ([1, 2], [-(2**63)])],
    )
    def test_negative_item_id(
        self, make_event: EventFactory, candidates: list[int], recent: list[int] | None
    ) -> None:
        value = _encoder().encode(make_event(candidate_item_ids=candidates, recent_item_ids=recent))
        rejected = _reject(_decoder(), value)
        assert rejected.reason is RejectReason.ID_OUT_OF_RANGE
        assert "item id" in rejected.detail

    def test_ids_above_max_id(self, make_event: EventFactory) -> None:
        settings = CodecSettings(max_id=1000)
        at_max = make_event(user_id=1000, candidate_item_ids=[1000], recent_item_ids=[1000])
        assert _decoder(settings).decode(_encoder().encode(at_max))["user_id"] == 1000
        for event in (
            make_event(user_id=1001),
            make_event(candidate_item_ids=[5, 1001]),
            make_event(recent_item_ids=[1001]),
        ):
            rejected = _reject(_decoder(settings), _encoder().encode(event))
            assert rejected.reason is RejectReason.ID_OUT_OF_RANGE

    @pytest.mark.parametrize("num_results", [0, -3])
    def test_num_results_below_one(self, make_event: EventFactory, num_results: int) -> None:
        value = _encoder().encode(make_event(num_results=num_results))
        assert _reject(_decoder(), value).reason is RejectReason.INVALID_FIELD

    def test_num_results_above_max(self, make_event: EventFactory) -> None:
        settings = CodecSettings(max_num_results=50)
        assert _decoder(settings).decode(_encoder().encode(make_event(num_results=50)))
        value = _encoder().encode(make_event(num_results=51))
        assert _reject(_decoder(settings), value).reason is RejectReason.INVALID_FIELD

    def test_rejected_message_str_carries_reason(self) -> None:
        rejected = _reject(_decoder(), b"")
        assert str(rejected).startswith("empty_value")


# ------------------------------------------------------------------------ Confluent framing --

HEADER = struct.Struct(">bI")


def _framed(schema_id: int, schema: Any, record: dict[str, Any], magic: int = 0) -> bytes:
    buf = io.BytesIO()
    buf.write(HEADER.pack(magic, schema_id))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def _user_event_schema_json() -> dict[str, Any]:
    return json.loads(USER_EVENT_SCHEMA_FILE.read_text())


def _write_schema(tmp_path: Path, name: str, schema: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(schema))
    return path


class TestConfluentFraming:
    def test_round_trip(self, make_event: EventFactory, confluent_settings: CodecSettings) -> None:
        event = make_event()
        value = _encoder(confluent_settings).encode(event)
        magic, schema_id = HEADER.unpack_from(value)
        assert magic == 0
        assert schema_id >= 1
        assert _decoder(confluent_settings).decode(value) == event

    def test_header_then_raw_body(
        self, make_event: EventFactory, confluent_settings: CodecSettings
    ) -> None:
        event = make_event()
        framed = _encoder(confluent_settings).encode(event)
        raw = _encoder().encode(event)
        assert framed[HEADER.size :] == raw
        assert len(framed) == len(raw) + 5

    def test_encoder_registers_under_topic_value_subject(
        self, make_event: EventFactory, confluent_settings: CodecSettings, shared_mock_registry: Any
    ) -> None:
        value = _encoder(confluent_settings).encode(make_event())
        client = shared_mock_registry.clients[confluent_settings.schema_registry_url]
        latest = client.get_latest_version("user-events-value")
        assert latest.schema_id == HEADER.unpack_from(value)[1]

    def test_recommendation_round_trip(self, confluent_settings: CodecSettings) -> None:
        codec = RecordCodec(confluent_settings, RECOMMENDATION_SCHEMA_FILE, "recs")
        value = codec.encode(_recommendation())
        assert value[0] == 0
        assert codec.decode(value) == _recommendation()

    @pytest.mark.parametrize("magic", [1, 0x7F, -1])
    def test_bad_magic_byte(
        self, make_event: EventFactory, confluent_settings: CodecSettings, magic: int
    ) -> None:
        value = bytearray(_encoder(confluent_settings).encode(make_event()))
        value[0] = magic & 0xFF
        rejected = _reject(_decoder(confluent_settings), bytes(value))
        assert rejected.reason is RejectReason.BAD_FRAMING

    @pytest.mark.parametrize("value", [b"\x00", b"\x00\x00\x00\x01"])
    def test_shorter_than_header(self, confluent_settings: CodecSettings, value: bytes) -> None:
        assert _reject(_decoder(confluent_settings), value).reason is RejectReason.BAD_FRAMING

    def test_raw_message_in_confluent_topic(
        self, make_event: EventFactory, confluent_settings: CodecSettings
    ) -> None:
        raw = _encoder().encode(make_event())  # starts with the event_id length, not 0
        assert raw[0] != 0
        assert _reject(_decoder(confluent_settings), raw).reason is RejectReason.BAD_FRAMING

    def test_unknown_schema_id(
        self, make_event: EventFactory, confluent_settings: CodecSettings
    ) -> None:
        value = _encoder(confluent_settings).encode(make_event())
        unknown = HEADER.pack(0, 987_654) + value[HEADER.size :]
        rejected = _reject(_decoder(confluent_settings), unknown)
        assert rejected.reason is RejectReason.UNKNOWN_SCHEMA
        assert "987654" in rejected.detail

    def test_evolved_writer_with_extra_field_is_resolved(
        self, make_event: EventFactory, confluent_settings: CodecSettings, tmp_path: Path
    ) -> None:
        schema = _user_event_schema_json()
        schema["fields"].append({"name": "session_id", "type": "string", "default": ""})
        path = _write_schema(tmp_path, "user_event_v2.avsc", schema)
        assert confluent_settings.schema_registry_url is not None
        lookup = SchemaLookup(confluent_settings.schema_registry_url)
        v1_id = lookup.register("user-events-value", USER_EVENT_SCHEMA_FILE)
        v2_id = lookup.register("user-events-v2-value", path)
        assert v2_id != v1_id

        event = make_event()
        value = _framed(v2_id, schema, {**event, "session_id": "s-123"})
        decoded = _decoder(confluent_settings).decode(value)
        assert decoded == event
        assert "session_id" not in decoded

    def test_evolved_writer_without_defaulted_field_gets_reader_default(
        self, make_event: EventFactory, confluent_settings: CodecSettings, tmp_path: Path
    ) -> None:
        schema = _user_event_schema_json()
        schema["fields"] = [f for f in schema["fields"] if f["name"] != "num_results"]
        path = _write_schema(tmp_path, "user_event_old.avsc", schema)
        assert confluent_settings.schema_registry_url is not None
        schema_id = SchemaLookup(confluent_settings.schema_registry_url).register("old", path)
        event = make_event()
        del event["num_results"]
        decoded = _decoder(confluent_settings).decode(_framed(schema_id, schema, event))
        assert decoded["num_results"] == 10
        assert decoded["candidate_item_ids"] == event["candidate_item_ids"]

    def test_incompatible_writer_schema_mismatch(
        self, make_event: EventFactory, confluent_settings: CodecSettings, tmp_path: Path
    ) -> None:
        schema = _user_event_schema_json()
        for field in schema["fields"]:
            if field["name"] == "user_id":
                field["type"] = "string"
        path = _write_schema(tmp_path, "user_event_bad.avsc", schema)
        assert confluent_settings.schema_registry_url is not None
        schema_id = SchemaLookup(confluent_settings.schema_registry_url).register("bad", path)
        value = _framed(schema_id, schema, make_event(user_id="u-42"))
        assert _reject(_decoder(confluent_settings), value).reason is RejectReason.SCHEMA_MISMATCH

    def test_validation_applies_after_confluent_decoding(
        self, make_event: EventFactory, confluent_settings: CodecSettings
    ) -> None:
        value = _encoder(confluent_settings).encode(make_event(candidate_item_ids=[]))
        assert _reject(_decoder(confluent_settings), value).reason is RejectReason.NO_CANDIDATES

    def test_writer_schema_looked_up_once_per_id(
        self, make_event: EventFactory, confluent_settings: CodecSettings, shared_mock_registry: Any
    ) -> None:
        value = _encoder(confluent_settings).encode(make_event())
        decoder = _decoder(confluent_settings)
        client = shared_mock_registry.clients[confluent_settings.schema_registry_url]
        calls: list[int] = []
        real_get = client.get_schema

        def counting_get(schema_id: int, *args: Any, **kwargs: Any) -> Any:
            calls.append(schema_id)
            return real_get(schema_id, *args, **kwargs)

        client.get_schema = counting_get
        for _ in range(5):
            decoder.decode(value)
        assert calls == [HEADER.unpack_from(value)[1]]

    def test_confluent_without_registry_url_is_an_error(self) -> None:
        with pytest.raises(ValueError, match="schema_registry_url"):
            _decoder(CodecSettings(framing=Framing.CONFLUENT))


class TestMockRegistryUrlWithoutPatching:
    """``SchemaLookup`` documents ``mock://name`` as confluent_kafka's in-memory registry.

    These tests do NOT use the ``shared_mock_registry`` fixture: they check that the pipeline's
    own client construction honours ``mock://`` URLs.
    """

    def test_schema_lookup_with_mock_url_registers_and_reads_back(self) -> None:
        lookup = SchemaLookup(f"mock://test-{uuid.uuid4().hex}")
        schema_id = lookup.register("user-events-value", USER_EVENT_SCHEMA_FILE)
        parsed = lookup.writer_schema(schema_id)
        assert parsed["name"] == "dev.streamrank.UserEvent"

    def test_record_codec_confluent_with_mock_url(self) -> None:
        settings = CodecSettings(
            framing=Framing.CONFLUENT, schema_registry_url=f"mock://test-{uuid.uuid4().hex}"
        )
        codec = RecordCodec(settings, RECOMMENDATION_SCHEMA_FILE, "recs")
        value = codec.encode(_recommendation())
        assert value[0] == 0
        assert codec.decode(value) == _recommendation()
