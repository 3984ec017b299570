"""Schema-registry failures in decode: only a truly unknown schema id is dead-lettered; an
unreachable or failing registry is retried, and never turns a valid event into a dead letter."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError

from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec, ReferenceDecoder
from pipeline.connectors.avro.schema_registry import RegistryUnavailable, SchemaLookup
from pipeline.settings.codec import CodecSettings
from pipeline.types import RejectedMessage, RejectReason
from tests.pipeline.conftest import EventFactory


def _flaky(decoder: ReferenceDecoder, failures: list[Exception]) -> list[int]:
    """Make the decoder's registry client raise ``failures`` first; returns the call log."""
    lookup = decoder._framing._lookup
    assert lookup is not None
    client = lookup._client
    real = client.get_schema
    calls: list[int] = []

    def get_schema(schema_id: int, *args: Any, **kwargs: Any) -> Any:
        calls.append(schema_id)
        if failures:
            raise failures.pop(0)
        return real(schema_id, *args, **kwargs)

    lookup._client = type("Flaky", (), {"get_schema": staticmethod(get_schema)})()
    return calls


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SchemaLookup, "retry_first_s", 0.01)
    monkeypatch.setattr(SchemaLookup, "retry_max_s", 0.02)


@pytest.mark.usefixtures("fast_retries")
def test_a_registry_outage_is_retried_and_the_event_decodes(
    make_event: EventFactory, confluent_settings: CodecSettings
) -> None:
    event = make_event()
    value = RecordCodec(confluent_settings, USER_EVENT_SCHEMA_FILE, "in").encode(event)
    decoder = ReferenceDecoder(confluent_settings, recent_cap=8)
    calls = _flaky(
        decoder,
        [ConnectionError("connection refused"), SchemaRegistryError(503, 50301, "overloaded")],
    )
    assert decoder.decode(value)["user_id"] == event["user_id"]
    assert len(calls) == 3


@pytest.mark.usefixtures("fast_retries")
def test_a_registry_down_for_too_long_stops_the_run_instead_of_dead_lettering(
    make_event: EventFactory, confluent_settings: CodecSettings
) -> None:
    value = RecordCodec(confluent_settings, USER_EVENT_SCHEMA_FILE, "in").encode(make_event())
    decoder = ReferenceDecoder(confluent_settings, recent_cap=8)
    decoder._framing._lookup._retry_for_s = 0.1  # type: ignore[union-attr]
    _flaky(decoder, [ConnectionError("refused")] * 1000)
    with pytest.raises(RegistryUnavailable, match="refused"):
        decoder.decode(value)


def test_only_a_not_found_answer_is_an_unknown_schema(
    make_event: EventFactory, confluent_settings: CodecSettings
) -> None:
    value = RecordCodec(confluent_settings, USER_EVENT_SCHEMA_FILE, "in").encode(make_event())
    decoder = ReferenceDecoder(confluent_settings, recent_cap=8)
    calls = _flaky(decoder, [SchemaRegistryError(404, 40403, "Schema not found")])
    with pytest.raises(RejectedMessage) as info:
        decoder.decode(value)
    assert info.value.reason is RejectReason.UNKNOWN_SCHEMA
    assert "40403" in info.value.detail or "not found" in info.value.detail
    assert len(calls) == 1  # no retry for a definite answer
