"""Weighted and sequence features: the weighted example (TorchRec's DLRM over an ``is_weighted``
EmbeddingBagCollection: topic ids weighted by a float array of the event, followed authors by a
``weights`` field of the reader's Redis hash) and the sequence example (a ranker of the user's
own attending over a watch history looked up in an EmbeddingCollection), each served by
``streamrank run`` on the real broker and Redis with one and two ranks (tables sharded, the
sequence table too), every published score checked against the module's own forward on the
KJT this test builds itself from the raw events and Redis values (tests/integration/byom.py:
weights included), within 1e-5."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer

from pipeline.settings.loading import Settings
from pipeline.stages.dead_letter import DETAIL_HEADER, REASON_HEADER
from tests.faults.helpers import dead_letters
from tests.integration.byom import (
    assert_scores,
    event_id,
    expected_scores,
    prepare_example,
    run_example,
    send,
    weighted_article,
    weighted_reader,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EVENTS = 150


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_weighted_example_scores_every_event_as_its_own_forward(
    nproc: int,
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    redis_client: redis.Redis,
    unique_name: Callable[[str], str],
    cli: Callable[..., subprocess.Popen],
    consumer_factory: Callable[..., Consumer],
) -> None:
    ex, settings = prepare_example(
        "weighted", tmp_path, settings_factory(), redis_client, unique_name("weighted")
    )
    records = ex.script.events(EVENTS, seed_=nproc)
    assert sum(len(r["topics"]) > 6 for r in records) > 0  # weights cut with their ids
    bad = ex.script.events(4, seed_=99)
    for record in bad:  # a weight array of another length than its ids: dead-lettered
        record["topics"] = [1, 2, 3]
        record["topic_minutes"] = [0.5, 1.5]
    send(settings, ex, records + bad)
    recs = run_example(cli, settings, ex, records, nproc, tmp_path / "run.log")
    assert_scores(recs, records, expected_scores(ex, records, redis_client, ex.reference()))

    by_id = {event_id(r): r for r in records}
    for rec in recs:  # a reader without a record, or without follows paired with weights
        record = by_id[rec["event_id"]]
        user = weighted_reader(ex, redis_client, record["reader"]["id"])[3]
        item = any(weighted_article(ex, redis_client, a)[2] for a in record["article_ids"])
        want = {"user_features"} if user else set()
        want |= {"item_features"} if item else set()
        assert set(rec["fallback_features"]) == want, record
    readers = {by_id[r["event_id"]]["reader"]["id"] for r in recs}
    assert any(r % 7 == 3 and r < ex.script.READERS for r in readers)  # broken pairs served

    letters = dead_letters(consumer_factory(settings.topics.dlq), len(bad))
    assert len(letters) == len(bad)
    headers = [dict(m.headers() or []) for m in letters]
    assert {h[REASON_HEADER].decode() for h in headers} == {"invalid_field"}
    details = {h[DETAIL_HEADER].decode() for h in headers}
    assert details == {
        "features.sparse.topics: 2 weights (topic_minutes) for 3 ids (topics): one weight per id"
    }


@pytest.mark.parametrize("nproc", [1, 2])
def test_the_sequence_example_scores_every_event_as_its_own_forward(
    nproc: int,
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    redis_client: redis.Redis,
    unique_name: Callable[[str], str],
    cli: Callable[..., subprocess.Popen],
) -> None:
    ex, settings = prepare_example(
        "sequence", tmp_path, settings_factory(), redis_client, unique_name("sequence")
    )
    records = ex.script.events(EVENTS, seed_=nproc)
    lengths = {min(len(r["watched"]), 10) for r in records}
    assert {0, 10} <= lengths and len(lengths) > 5  # empty, cut and partial histories
    send(settings, ex, records)
    recs = run_example(cli, settings, ex, records, nproc, tmp_path / "run.log")
    assert_scores(recs, records, expected_scores(ex, records, redis_client, ex.reference()))
    no_user = [r for r in recs if "user_features" in r["fallback_features"]]
    assert no_user and len(no_user) < len(recs)
