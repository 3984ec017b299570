"""Bring your own model: both worked examples served by ``streamrank run`` on the real broker and
Redis, one and two ranks, their scores checked against the module's own forward on inputs this
test builds from the raw events and Redis values (tests/integration/byom.py)."""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer

from model.module.store import import_state_dict
from model.store.versions import ModelVersions
from pipeline.connectors.kafka.clients import make_producer, produce
from pipeline.models.preflight import configured_module
from pipeline.settings.loading import Settings, load_settings
from pipeline.stages.dead_letter import DETAIL_HEADER, REASON_HEADER
from tests.faults.helpers import dead_letters
from tests.integration.byom import Example, expected_scores, make_example
from tests.integration.conftest import collect

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EVENTS = 150


def example_settings(ex: Example, base: Settings) -> Settings:
    """The example's TOML with the test's broker, topics, Redis and small batches."""
    return load_settings(
        ex.toml,
        kafka=base.kafka,
        topics=base.topics,
        redis=base.redis,
        batching=base.batching.model_copy(update={"max_batch_rows": 128}),
        metrics=base.metrics,
    )


@pytest.fixture(params=["deepfm", "dcn"])
def example(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    redis_client: redis.Redis,
    unique_name: Callable[[str], str],
) -> tuple[Example, Settings]:
    """The example's model imported as the current version, its features seeded."""
    versions = tmp_path / "versions"
    ex = make_example(request.param, tmp_path, unique_name("byom"), versions)
    settings = example_settings(ex, settings_factory())
    ex.script.seed(redis_client, ex.user_key, ex.item_key)
    config, _ = configured_module(settings)
    prefix = settings.model.module.state_dict_prefix if settings.model.module else ""
    import_state_dict(
        config, ex.state_dict, ModelVersions.create(versions), strip_prefix=prefix, promote=True
    )
    return ex, settings


def send(settings: Settings, ex: Example, records: list[dict[str, Any]]) -> None:
    producer = make_producer(settings.kafka)
    for record in records:
        produce(producer, settings.topics.input, ex.script.encode(record))
    assert producer.flush(30) == 0


def event_id(record: dict[str, Any]) -> str:
    return str(record.get("view_id") or record["request_id"])


@pytest.mark.parametrize("nproc", [1, 2])
def test_an_example_model_scores_every_event_once_as_its_own_forward(
    nproc: int,
    example: tuple[Example, Settings],
    redis_client: redis.Redis,
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
    consumer_factory: Callable[..., Consumer],
) -> None:
    ex, settings = example
    records = ex.script.events(EVENTS, seed_=nproc)
    bad = []
    if ex.name == "dcn":  # a listing outside the identity table: dead-lettered, named
        bad = ex.script.events(3, seed_=99)
        for record in bad:
            record["listing_ids"].append(3000 + len(record["listing_ids"]))
    send(settings, ex, records + bad)
    log = tmp_path / "run.log"
    proc = cli(
        settings,
        "run", "--nproc", str(nproc), "--exit-when-idle", "4", "-c", str(ex.toml),
        extra_env={"STREAMRANK_BATCHING__MAX_BATCH_ROWS": "128"},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert proc.wait(400) == 0, log.read_text()[-4000:]

    recs = collect(settings, expected=EVENTS)
    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == {event_id(r) for r in records}
    assert max(counts.values()) == 1
    expected = expected_scores(ex, records, redis_client, ex.reference())
    by_id = {event_id(r): r for r in records}
    worst = 0.0
    for rec in recs:
        want = expected[rec["event_id"]]
        record = by_id[rec["event_id"]]
        asked = record.get("slots") or record.get("want") or 5
        assert len(rec["items"]) == min(asked, len(want))
        for item in rec["items"]:
            worst = max(worst, abs(item["score"] - want[item["item_id"]]))
        kth = sorted(want.values(), reverse=True)[len(rec["items"]) - 1]
        assert min(i["score"] for i in rec["items"]) >= kth - 1e-5
    assert worst <= 1e-5
    # Viewers/shoppers without a Redis record fall back to defaults, flagged.
    no_user = [r for r in recs if "user_features" in r["fallback_features"]]
    assert no_user and len(no_user) < len(recs)
    if bad:
        letters = dead_letters(consumer_factory(settings.topics.dlq), len(bad))
        assert len(letters) == len(bad)
        headers = [dict(m.headers() or []) for m in letters]
        assert {h[REASON_HEADER].decode() for h in headers} == {"id_out_of_range"}
        details = [h[DETAIL_HEADER].decode() for h in headers]
        assert all("features.sparse.listing: id 30" in d for d in details), details
