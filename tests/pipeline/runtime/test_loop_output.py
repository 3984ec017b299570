"""The whole loop (fake Kafka clients) writing an output schema of the user's (``[output]``), in
raw framing and in Confluent framing (the schema registered under ``<output topic>-value`` in
confluent-kafka's ``mock://`` registry): a consumer that knows only the ``.avsc`` (or the
registry) reads every scored event with fastavro."""

from __future__ import annotations

import io
import json
from collections import deque
from pathlib import Path
from typing import Any

import confluent_kafka.schema_registry as registries
import fastavro
import pytest

from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.codec import CodecSettings, Framing
from pipeline.settings.output import OutputSettings
from tests.pipeline.factories import event_messages, user_event
from tests.pipeline.fakes import FakeConsumer, FakeProducer
from tests.pipeline.runtime.loops import IN, OUT, fake_loop, loop_settings

SCHEMA = {
    "type": "record", "name": "Answer", "namespace": "team.recs", "fields": [
        {"name": "id", "type": "string"},
        {"name": "user", "type": ["null", "long"], "default": None},
        {"name": "items", "type": {"type": "array", "items": "long"}},
        {"name": "scores", "type": {"type": "array", "items": "float"}},
        {"name": "version", "type": "string"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "requested_at", "type": "long"},
        {"name": "degraded", "type": "boolean"},
        {"name": "retrieved", "type": "boolean", "default": False},
        {"name": "source", "type": "string", "default": "streamrank"},
    ]}  # fmt: skip


@pytest.mark.parametrize("framing", [Framing.RAW, Framing.CONFLUENT])
def test_the_loop_writes_the_users_schema_and_a_consumer_of_it_reads_every_event(
    tmp_path: Path, framing: Framing, request: pytest.FixtureRequest
) -> None:
    schema_file = tmp_path / "answer.avsc"
    schema_file.write_text(json.dumps(SCHEMA))
    codec = CodecSettings()
    if framing is Framing.CONFLUENT:  # one in-memory registry per URL, for every client
        codec = request.getfixturevalue("confluent_settings")
    output = OutputSettings(
        schema_file=schema_file, event_id="id", user_id="user", items="items", scores="scores",
        model_version="version", scored_at="at", event_time="requested_at",
        fallback_features="degraded",
    )  # fmt: skip
    settings = loop_settings(BatchingSettings(max_batch_rows=16, max_delay_ms=5))
    settings = settings.model_copy(update={"codec": codec, "output": output})
    records = [user_event(candidates=2 + i % 5, user_id=i, num_results=3) for i in range(25)]
    events = RecordCodec(codec, USER_EVENT_SCHEMA_FILE, IN)
    consumer = FakeConsumer(
        messages=deque(event_messages(IN, [events.encode(r) for r in records])),
        partitions=[(IN, 0)],
    )
    producer = FakeProducer(ack_every_poll=True)
    summary = fake_loop(settings, consumer, producer).run(exit_when_idle_s=0.05)
    assert summary.events_out == len(records)

    reader: Any = fastavro.parse_schema(json.loads(schema_file.read_text()))  # the .avsc alone
    got = []
    for message in producer.on_topic(OUT):
        value = message.value() or b""
        buf = io.BytesIO(value)
        if framing is Framing.CONFLUENT:  # the schema the registry holds for this id
            assert value[0] == 0
            schema_id = int.from_bytes(value[1:5], "big")
            registry = registries.SchemaRegistryClient({"url": codec.schema_registry_url})
            text = registry.get_schema(schema_id).schema_str
            assert json.loads(text) == SCHEMA
            reader = fastavro.parse_schema(json.loads(text))
            buf.seek(5)
        got.append(fastavro.schemaless_reader(buf, reader, None))
        assert buf.tell() == len(value)
    assert [g["id"] for g in got] == [r["event_id"] for r in records]
    for record, out in zip(records, got, strict=True):
        wanted = min(3, len(record["candidate_item_ids"]))
        assert out["user"] == record["user_id"] and out["version"] == "tiny-1"
        assert len(out["items"]) == len(out["scores"]) == wanted
        assert set(out["items"]) <= set(record["candidate_item_ids"])
        assert out["scores"] == sorted(out["scores"], reverse=True)
        assert out["requested_at"] == int(record["event_time"].timestamp() * 1000)
        assert out["degraded"] is True  # the defaults enricher: every user fell back
        assert out["retrieved"] is False and out["source"] == "streamrank"
