"""Events without candidates on the real broker and Redis: answered with retrieved items
(from the served model's index over the items in Redis), ranked exactly as the checkpoint
scores them offline; and events written with the previous UserEvent schema still decode, in
both framings."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model.features.spec import FeatureSpec
from model.rank import RankContext
from model.retrieval.candidates import fill_candidates
from model.synthetic import SyntheticWorld, to_event_dicts
from pipeline.connectors.avro.reference import (
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
    records_to_columns,
)
from pipeline.connectors.kafka.clients import make_producer, produce
from pipeline.observability.metrics import Metrics
from pipeline.serve import build_pipeline
from pipeline.settings.codec import CodecSettings, Framing
from pipeline.settings.loading import Settings
from tests.integration.conftest import (
    BackgroundPipeline,
    SentEvents,
    collect,
    max_score_error,
    offline_scores,
)
from tests.pipeline.conftest import shared_mock_registry  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow

V1_USER_EVENT = Path(__file__).resolve().parents[1] / "schemas" / "v1" / "user_event.avsc"


def _send(settings: Settings, records: list[dict[str, Any]], schema: Path) -> None:
    codec = RecordCodec(settings.codec, schema, settings.topics.input)
    producer = make_producer(settings.kafka.config)
    for record in records:
        produce(producer, settings.topics.input, codec.encode(record), key=b"k")
    assert producer.flush(30) == 0


def _records(world: SyntheticWorld, n: int) -> tuple[Any, list[dict[str, Any]]]:
    sampled = world.sample_events(n, np.random.default_rng(5))
    records = list(to_event_dicts(sampled, world))
    for record in records:
        record["event_id"] = f"r-{uuid.uuid4().hex[:12]}"
        record["event_time"] = int(time.time() * 1000)
    return sampled, records


def test_events_without_candidates_get_retrieved_ranked_items(
    pipeline_settings: Settings,
    world: SyntheticWorld,
    spec: FeatureSpec,
    background_pipeline: Callable[..., BackgroundPipeline],
) -> None:
    settings = pipeline_settings
    pipeline = build_pipeline(settings, RankContext(), Metrics())
    index = pipeline.retriever.index
    assert index is not None and index.num_items == len(world.item_ids)  # the items in Redis
    sampled, records = _records(world, 120)
    asks = {r["event_id"] for i, r in enumerate(records) if i % 2}
    sent = [{**r, "candidate_item_ids": []} if r["event_id"] in asks else r for r in records]
    bp = background_pipeline(settings, pipeline=pipeline)
    _send(settings, sent, USER_EVENT_SCHEMA_FILE)
    recs = collect(settings, expected=len(sent))
    summary = bp.stop()

    assert sorted(r["event_id"] for r in recs) == sorted(r["event_id"] for r in sent)
    assert summary.dead_lettered == 0
    assert {r["event_id"] for r in recs if r["retrieved"]} == asks
    # What the index retrieves for each asking event (its own columns, searched alone).
    item_index = {int(item): i for i, item in enumerate(world.item_ids)}
    retrieved: dict[str, list[int]] = {}
    for record in sent:
        if record["event_id"] in asks:
            recent = (record["recent_item_ids"] or [])[: spec.recent_items_cap]
            columns = records_to_columns([{**record, "recent_item_ids": recent}])
            found = fill_candidates(columns, index).candidate_ids
            retrieved[record["event_id"]] = found.tolist()
            assert len(found) == settings.retrieval.num_candidates
    by_id = {r["event_id"]: r for r in records}
    for rec in recs:
        if rec["retrieved"]:
            want = min(by_id[rec["event_id"]]["num_results"], settings.retrieval.num_candidates)
            assert len(rec["items"]) == want
            assert {i["item_id"] for i in rec["items"]} <= set(retrieved[rec["event_id"]])
    # Scored like given candidates: the offline scores of the retrieved items, their top-k.
    counts = np.array(
        [len(retrieved.get(r["event_id"], r["candidate_item_ids"])) for r in records], np.int64
    )
    items = [retrieved.get(r["event_id"], r["candidate_item_ids"]) for r in records]
    as_sampled = dataclasses.replace(
        sampled,
        candidate_counts=counts,
        candidate_items=np.array([item_index[i] for ids in items for i in ids], np.int64),
    )
    as_records = [{**r, "candidate_item_ids": ids} for r, ids in zip(records, items, strict=True)]
    offline = offline_scores(
        SentEvents(as_sampled, as_records), world, spec, settings.model.checkpoint
    )
    assert max_score_error(recs, offline) <= 1e-5


@pytest.mark.parametrize("framing", [Framing.RAW, Framing.CONFLUENT])
def test_events_written_with_the_previous_schema_are_answered(
    framing: Framing,
    settings_factory: Callable[..., Settings],
    pipeline_settings: Settings,
    world: SyntheticWorld,
    background_pipeline: Callable[..., BackgroundPipeline],
    shared_mock_registry: object,  # noqa: F811  (the fixture imported above)
) -> None:
    registry = f"mock://v1-{uuid.uuid4().hex}" if framing is Framing.CONFLUENT else None
    codec = CodecSettings(framing=framing, schema_registry_url=registry)
    settings = pipeline_settings.model_copy(update={"codec": codec})
    _, records = _records(world, 30)
    records[7]["candidate_item_ids"] = []  # v1 allowed an empty list: now it asks for retrieval
    bp = background_pipeline(settings, pipeline=build_pipeline(settings, RankContext(), Metrics()))
    _send(settings, records, V1_USER_EVENT)  # a producer still on the previous schema
    recs = collect(settings, expected=len(records))
    summary = bp.stop()

    assert sorted(r["event_id"] for r in recs) == sorted(r["event_id"] for r in records)
    assert summary.dead_lettered == 0
    assert [r["event_id"] for r in recs if r["retrieved"]] == [records[7]["event_id"]]
