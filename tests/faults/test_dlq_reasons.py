"""Every dead-letter reason, reached on the real broker and Redis, in the Confluent framing.

One poison message per :class:`RejectReason` goes through the real pipeline among valid events;
each must come back from the DLQ topic with exactly its reason and its original bytes. The
framing is Confluent's (magic byte + schema id) because three reasons exist only there
(``bad_framing``, ``unknown_schema``, ``schema_mismatch``); the schema registry is
confluent-kafka's in-memory ``mock://`` client, shared per URL by the ``shared_mock_registry``
fixture (no registry server can run here: see RELIABILITY.md). The pipeline runs in this
process, so the test and the pipeline see the same registry.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from model.synthetic import SyntheticWorld
from pipeline.connectors.avro.reference import (
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
)
from pipeline.connectors.avro.schema_registry import SchemaLookup
from pipeline.observability.metrics import Metrics
from pipeline.settings.codec import CodecSettings, Framing
from pipeline.settings.loading import Settings
from pipeline.stages.dead_letter import DETAIL_HEADER, REASON_HEADER
from pipeline.stages.enrich.enricher import FeatureEnricher
from pipeline.types import RejectReason
from tests.faults.helpers import dead_letters, seeded_settings
from tests.faults.test_poison_input import sent_like
from tests.integration.conftest import BackgroundPipeline, SentEvents, collect, spec_of
from tests.pipeline.conftest import shared_mock_registry  # noqa: F401  (fixture)
from tests.support.faults import FailingEnricher

pytestmark = pytest.mark.slow

VALID_EVENTS = 200
PROCESSING_POISON_USER = 2**62 + 7  # no synthetic user (their ids start at 10**12)
"""The user of a valid event whose enrichment fails (the enricher the pipeline takes as an
argument fails for it): the only way to reach ``processing_error``."""


def failing_enricher(settings: Settings) -> FailingEnricher:
    """Redis features as configured, failing for :data:`PROCESSING_POISON_USER`."""
    spec = spec_of(settings)
    real = FeatureEnricher(
        settings.redis, spec.user_dense_dim, spec.item_dense_dim, spec.recent_items_cap, Metrics()
    )
    return FailingEnricher(real, {PROCESSING_POISON_USER})


def incompatible_schema(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """A UserEvent schema whose ``user_id`` is a string: it cannot resolve against ours."""
    schema = json.loads(USER_EVENT_SCHEMA_FILE.read_text())
    for field in schema["fields"]:
        if field["name"] == "user_id":
            field["type"] = "string"
    path = tmp_path / "user_event_string_id.avsc"
    path.write_text(json.dumps(schema))
    return path, schema


def poison_per_reason(
    settings: Settings, world: SyntheticWorld, tmp_path: Path
) -> dict[RejectReason, bytes]:
    """One message for each reason, in the Confluent framing of ``settings.codec``."""
    codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    raw_codec = RecordCodec(CodecSettings(), USER_EVENT_SCHEMA_FILE, settings.topics.input)
    now_ms = int(time.time() * 1000)
    valid = dict(sent_like(world), event_time=now_ms)

    def event(**fields: object) -> bytes:
        return codec.encode({**valid, **fields})

    framed = event()
    header = framed[:5]  # magic byte 0 + the registered schema id
    assert framed[0] == 0 and raw_codec.encode(valid) == framed[5:]
    assert settings.codec.schema_registry_url is not None
    bad_path, _ = incompatible_schema(tmp_path)
    bad_id = SchemaLookup(settings.codec.schema_registry_url).register("string-id-value", bad_path)
    string_id_body = RecordCodec(CodecSettings(), bad_path, "unused").encode(
        {**valid, "user_id": "u-42"}
    )
    unknown_id = 987_654
    assert unknown_id != bad_id and int.from_bytes(header[1:]) != unknown_id
    poison = {
        RejectReason.EMPTY: b"",
        RejectReason.OVERSIZED: event(recent_item_ids=[2**40] * 2000),
        RejectReason.UNDECODABLE: header + b"\x01garbage\xff",
        RejectReason.BAD_FRAMING: raw_codec.encode(valid),  # no Confluent header
        RejectReason.UNKNOWN_SCHEMA: b"\x00" + unknown_id.to_bytes(4) + framed[5:],
        RejectReason.SCHEMA_MISMATCH: b"\x00" + bad_id.to_bytes(4) + string_id_body,
        RejectReason.NO_CANDIDATES: event(candidate_item_ids=[]),
        RejectReason.TOO_MANY_CANDIDATES: event(candidate_item_ids=list(range(201))),
        RejectReason.ID_OUT_OF_RANGE: event(user_id=-5),
        RejectReason.INVALID_FIELD: event(num_results=0),
        RejectReason.TOO_MANY_RECENT_ITEMS: event(recent_item_ids=list(range(51))),
        RejectReason.INVALID_STRING: event(event_id=""),
        RejectReason.INVALID_EVENT_TIME: event(event_time=now_ms // 1000),  # seconds
        RejectReason.PROCESSING_ERROR: event(user_id=PROCESSING_POISON_USER),
    }
    assert set(poison) == set(RejectReason), "a reason without a poison message"
    return poison


def test_every_dlq_reason_is_reached_on_the_real_broker_in_confluent_framing(
    settings_factory: Callable[..., Settings],
    trained_checkpoint: Path,
    world: SyntheticWorld,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[..., BackgroundPipeline],
    consumer_factory: Callable[..., Consumer],
    shared_mock_registry: object,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    codec = CodecSettings(
        framing=Framing.CONFLUENT,
        schema_registry_url=f"mock://dlq-reasons-{uuid.uuid4().hex}",
        max_message_bytes=8192,
        max_candidates=200,
        max_recent_items=50,
        max_string_length=64,
    )
    settings = seeded_settings(settings_factory, trained_checkpoint, world, codec=codec)
    poison = poison_per_reason(settings, world, tmp_path)
    sent = send_events(settings, VALID_EVENTS, extra_values=list(poison.values()))
    dlq = consumer_factory(settings.topics.dlq)
    bp = background_pipeline(settings, enricher=failing_enricher(settings))
    recs = collect(settings, expected=VALID_EVENTS)
    dead = dead_letters(dlq, expected=len(poison))
    summary = bp.stop()

    assert {r["event_id"] for r in recs} == sent.ids and len(recs) == VALID_EVENTS
    by_reason: dict[str, list[bytes]] = {}
    for msg in dead:
        headers = dict(msg.headers() or [])
        assert headers[DETAIL_HEADER], "every dead letter says why"
        by_reason.setdefault(headers[REASON_HEADER].decode(), []).append(msg.value() or b"")
    assert sorted(by_reason) == sorted(reason.value for reason in RejectReason)
    for reason, value in poison.items():
        assert by_reason[reason.value] == [value], reason  # one each, the original bytes
    assert summary.dead_lettered == len(RejectReason) == 14
