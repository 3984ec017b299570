"""Ingest workers (``batching.ingest_workers = K``) against the real Kafka broker and Redis:
every valid event gets exactly one Recommendation with the offline model's scores, every
malformed message is dead-lettered with the same reason as without workers (K = 0 runs the same
test), the offsets are committed at the end, and the workers' counts reach the process's one
metrics endpoint; events without candidates are answered with the items the served model's
index retrieves (each worker builds it); then the same over 2 ranks of a sharded model, one
worker each. K = 0 and 1 and the 2 ranks are ``slow`` (the default suite runs K = 2)."""

from __future__ import annotations

import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from confluent_kafka import Consumer, TopicPartition

from model.features.spec import FeatureSpec
from model.retrieval.candidates import fill_candidates
from model.synthetic import SyntheticWorld, to_event_dicts
from pipeline.connectors.avro.reference import (
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
    records_to_columns,
)
from pipeline.connectors.kafka.clients import make_producer, produce
from pipeline.models.loader import ModelLoader
from pipeline.settings.codec import CodecSettings
from pipeline.settings.loading import Settings
from pipeline.stages.dead_letter import REASON_HEADER
from tests.faults.helpers import dead_letters, seeded_settings
from tests.integration.conftest import (
    SentEvents,
    collect,
    free_port,
    max_score_error,
    offline_scores,
    sample_value,
    scrape,
)
from tests.support.logs import failure_excerpt
from tests.support.malformed import malformed_values

pytestmark = pytest.mark.timeout(600)

CODEC = {"STREAMRANK_CODEC__MAX_MESSAGE_BYTES": "4096", "STREAMRANK_CODEC__MAX_CANDIDATES": "200"}
NO_RETRIEVAL = {"STREAMRANK_RETRIEVAL__ENABLED": "false"}  # an empty candidate list is rejected


class MixedInput(NamedTuple):
    """Fresh topics holding 300 valid events and every kind of malformed message."""

    settings: Settings
    malformed: dict[bytes, set[str]]
    """Each malformed value, with the reasons it may be dead-lettered for."""
    sent: SentEvents
    dlq: Consumer
    """A reader of the dead-letter topic."""


@pytest.fixture
def mixed_input(
    settings_factory: Callable[..., Settings],
    trained_checkpoint: Path,
    world: SyntheticWorld,
    send_events: Callable[..., SentEvents],
    consumer_factory: Callable[..., Consumer],
) -> MixedInput:
    codec = CodecSettings(max_message_bytes=4096, max_candidates=200)
    settings = seeded_settings(settings_factory, trained_checkpoint, world, codec=codec)
    malformed = malformed_values(settings, world)
    sent = send_events(settings, 300, extra_values=list(malformed))
    return MixedInput(settings, malformed, sent, consumer_factory(settings.topics.dlq))


def committed_everything(settings: Settings) -> bool:
    """Whether the group's committed offset of every input partition is its end."""
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": settings.kafka.group_id}
    )
    try:
        topic = settings.topics.input
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
        return all(tp.offset == ends[tp.partition] for tp in committed)
    finally:
        consumer.close()


@pytest.mark.parametrize(
    "workers",
    [
        pytest.param(0, marks=pytest.mark.slow),  # the one-process reference (test_end_to_end)
        pytest.param(1, marks=pytest.mark.slow),
        2,
    ],
)
def test_every_event_once_every_malformed_message_with_its_reason_offsets_committed(
    workers: int,
    mixed_input: MixedInput,
    trained_checkpoint: Path,
    world: SyntheticWorld,
    spec: FeatureSpec,
    cli: Callable[..., subprocess.Popen],
    tmp_path: Path,
) -> None:
    settings, malformed, sent, dlq = mixed_input
    port = free_port()
    log = tmp_path / "run.log"
    summary_file = tmp_path / "summary.json"
    env = {
        **CODEC,
        **NO_RETRIEVAL,
        "STREAMRANK_BATCHING__INGEST_WORKERS": str(workers),
        "STREAMRANK_BATCHING__MAX_BATCH_ROWS": "128",
        "STREAMRANK_METRICS__ENABLED": "true",
        "STREAMRANK_METRICS__PORT": str(port),
    }
    proc = cli(
        settings,
        "run",
        "--exit-when-idle",
        "4",
        "--summary-json",
        str(summary_file),
        extra_env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    # The process's one endpoint counts every message its workers consumed.
    total = len(sent.ids) + len(malformed)
    consumed = None
    deadline = time.monotonic() + 300
    while consumed != total and proc.poll() is None:
        assert time.monotonic() < deadline, f"consumed {consumed} of {total}"
        body = scrape(port)
        consumed = sample_value(body, "streamrank_consumed_messages_total")
        time.sleep(0.2)
    assert consumed == total, failure_excerpt(log)
    assert body.count("# TYPE streamrank_world_size gauge") == 1
    assert sample_value(body, "streamrank_world_size") == 1.0
    assert proc.wait(300) == 0, failure_excerpt(log)

    recs = collect(settings, expected=300)
    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == sent.ids and max(counts.values()) == 1  # nothing lost, nothing extra
    assert max_score_error(recs, offline_scores(sent, world, spec, trained_checkpoint)) <= 1e-5
    dead = dead_letters(dlq, expected=len(malformed))
    assert len(dead) == len(malformed)
    for message in dead:
        reason = dict(message.headers())[REASON_HEADER].decode()
        assert reason in malformed[message.value() or b""]
    assert {m.value() or b"" for m in dead} == set(malformed)
    assert committed_everything(settings)

    summary = json.loads(summary_file.read_text())
    assert summary["events_out"] == 300 and summary["dead_lettered"] == len(malformed)
    assert len(summary.get("workers", [])) == workers
    assert sum(w["events_in"] for w in summary.get("workers", [])) == (total if workers else 0)
    if workers:
        assert "[w0]" in log.read_text()


@pytest.mark.slow
def test_two_ranks_with_a_worker_each_score_every_event_once(
    mixed_input: MixedInput,
    trained_checkpoint: Path,
    world: SyntheticWorld,
    spec: FeatureSpec,
    cli: Callable[..., subprocess.Popen],
    tmp_path: Path,
) -> None:
    settings, malformed, sent, dlq = mixed_input
    log = tmp_path / "ranks.log"
    summary_file = tmp_path / "summary.json"
    env = {**CODEC, **NO_RETRIEVAL, "STREAMRANK_BATCHING__INGEST_WORKERS": "1"}
    args = ("--nproc", "2", "--exit-when-idle", "4", "--summary-json", str(summary_file))
    out = log.open("w")
    proc = cli(settings, "run", *args, extra_env=env, stdout=out, stderr=subprocess.STDOUT)
    assert proc.wait(480) == 0, failure_excerpt(log, 4000)

    recs = collect(settings, expected=300)
    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == sent.ids and max(counts.values()) == 1
    assert max_score_error(recs, offline_scores(sent, world, spec, trained_checkpoint)) <= 1e-5
    dead = dead_letters(dlq, expected=len(malformed))
    assert {m.value() or b"" for m in dead} == set(malformed) and len(dead) == len(malformed)
    assert committed_everything(settings)
    summary = json.loads(summary_file.read_text())
    assert summary["world_size"] == 2 and summary["events_out"] == 300
    assert [len(r["workers"]) for r in summary["ranks"]] == [1, 1]


def test_a_worker_answers_events_without_candidates_with_retrieved_items(
    pipeline_settings: Settings,
    world: SyntheticWorld,
    spec: FeatureSpec,
    cli: Callable[..., subprocess.Popen],
    tmp_path: Path,
) -> None:
    settings = pipeline_settings
    index = ModelLoader(settings).retrieval_index(settings.model.checkpoint)
    assert index is not None  # the items in Redis
    records = list(to_event_dicts(world.sample_events(40, np.random.default_rng(3)), world))
    for number, record in enumerate(records):
        record["event_id"] = f"w-{number}"
        record["event_time"] = int(time.time() * 1000)
    asks = {r["event_id"] for number, r in enumerate(records) if number % 2}
    sent = [{**r, "candidate_item_ids": []} if r["event_id"] in asks else r for r in records]
    codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    producer = make_producer(settings.kafka.config)
    for record in sent:
        produce(producer, settings.topics.input, codec.encode(record), key=b"k")
    assert producer.flush(30) == 0
    log = tmp_path / "run.log"
    env = {"STREAMRANK_BATCHING__INGEST_WORKERS": "1"}
    proc = cli(
        settings,
        "run",
        "--exit-when-idle",
        "2",
        extra_env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    assert proc.wait(300) == 0, failure_excerpt(log)

    recs = collect(settings, expected=len(sent))
    assert sorted(r["event_id"] for r in recs) == sorted(r["event_id"] for r in sent)
    assert {r["event_id"] for r in recs if r["retrieved"]} == asks
    for rec in recs:
        if not rec["retrieved"]:
            continue
        record = next(r for r in sent if r["event_id"] == rec["event_id"])
        recent = (record["recent_item_ids"] or [])[: spec.recent_items_cap]
        columns = records_to_columns([{**record, "recent_item_ids": recent}])
        found = set(fill_candidates(columns, index).candidate_ids.tolist())
        assert rec["items"] and {i["item_id"] for i in rec["items"]} <= found
