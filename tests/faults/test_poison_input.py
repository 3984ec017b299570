"""Fault (f) on the real stack: poison of many kinds goes to the DLQ with its reason while the
valid events around it are scored; NaN/inf features in Redis are replaced by defaults with the
fallback flag, never scored as NaN."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import redis
from confluent_kafka import Consumer

from model.synthetic import SyntheticWorld
from pipeline.connectors.avro.reference import (
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
)
from pipeline.connectors.redis.feature_store import encode_items, encode_user, item_key, user_key
from pipeline.settings.codec import CodecSettings
from pipeline.settings.loading import Settings
from pipeline.stages.dead_letter import REASON_HEADER
from pipeline.types import RejectReason
from tests.faults.helpers import dead_letters, seeded_settings
from tests.integration.conftest import BackgroundPipeline, SentEvents, collect

pytestmark = pytest.mark.slow


def sent_like(world: SyntheticWorld) -> dict[str, object]:
    """A valid UserEvent of the test world; the poison below changes one field of it."""
    items = [int(i) for i in world.item_ids[:5]]
    return {
        "event_id": "poison",
        "user_id": int(world.user_ids[0]),
        "context": {"device": "ios", "country": "US"},
        "candidate_item_ids": items,
        "recent_item_ids": None,
        "num_results": 3,
    }


def test_poison_of_every_kind_is_dead_lettered_with_its_reason(
    settings_factory: Callable[..., Settings],
    trained_checkpoint: Path,
    world: SyntheticWorld,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[[Settings], BackgroundPipeline],
    consumer_factory: Callable[..., Consumer],
) -> None:
    limits = CodecSettings(
        max_message_bytes=8192, max_candidates=200, max_recent_items=50, max_string_length=64
    )
    settings = seeded_settings(settings_factory, trained_checkpoint, world, codec=limits)
    codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    now_ms = int(time.time() * 1000)
    valid = dict(sent_like(world), event_time=now_ms)

    def event(**fields: object) -> bytes:
        return codec.encode({**valid, **fields})

    poison: list[tuple[str, bytes]] = [
        (RejectReason.UNDECODABLE, b"\x00\x01garbage\xff"),
        (RejectReason.EMPTY, b""),
        (RejectReason.OVERSIZED, event(recent_item_ids=[2**40] * 2000)),
        (RejectReason.NO_CANDIDATES, event(candidate_item_ids=[])),
        (RejectReason.TOO_MANY_CANDIDATES, event(candidate_item_ids=list(range(201)))),
        (RejectReason.ID_OUT_OF_RANGE, event(user_id=-5)),
        (RejectReason.ID_OUT_OF_RANGE, event(candidate_item_ids=[1, -2])),
        (RejectReason.INVALID_FIELD, event(num_results=0)),
        (RejectReason.INVALID_FIELD, event(num_results=2**31 - 1)),
        (RejectReason.TOO_MANY_RECENT_ITEMS, event(recent_item_ids=list(range(51)))),
        (RejectReason.INVALID_STRING, event(event_id="")),
        (RejectReason.INVALID_STRING, event(event_id="x" * 65)),
        (RejectReason.INVALID_STRING, event(context={"device": "", "country": "US"})),
        (RejectReason.INVALID_STRING, event(context={"device": "ios", "country": "U" * 65})),
        (RejectReason.INVALID_EVENT_TIME, event(event_time=now_ms // 1000)),  # seconds
        (RejectReason.INVALID_EVENT_TIME, event(event_time=now_ms + 10 * 86_400_000)),
    ]
    assert len(poison) >= 12
    sent = send_events(settings, 200, extra_values=[value for _, value in poison])
    dlq = consumer_factory(settings.topics.dlq)
    bp = background_pipeline(settings)
    recs = collect(settings, expected=200)
    dead = dead_letters(dlq, expected=len(poison))
    summary = bp.stop()

    assert {r["event_id"] for r in recs} == sent.ids and len(recs) == 200
    expected = sorted((reason.value, value) for reason, value in poison)
    got = sorted((dict(m.headers())[REASON_HEADER].decode(), m.value() or b"") for m in dead)
    assert [reason for reason, _ in got] == [reason for reason, _ in expected]
    assert got == expected  # the original bytes, untouched
    assert summary.dead_lettered == len(poison)


def test_non_finite_redis_features_fall_back_to_defaults_never_nan(
    pipeline_settings: Settings,
    world: SyntheticWorld,
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[[Settings], BackgroundPipeline],
) -> None:
    client = redis.Redis.from_url(pipeline_settings.redis.url)
    prefix, user_dim = pipeline_settings.redis.key_prefix, world.user_dense.shape[1]
    poisoned_users = [int(u) for u in world.user_ids[:200]]
    nan_dense = np.full(user_dim, np.nan, np.float32)
    nan_dense[0] = np.inf
    for user in poisoned_users:
        client.set(user_key(prefix, user), encode_user(nan_dense, []))
    items = world.item_ids
    bad_items = encode_items(
        np.zeros(len(items), np.int64), np.full((len(items), world.item_dense.shape[1]), np.nan)
    )
    client.mset({item_key(prefix, int(i)): v for i, v in zip(items, bad_items, strict=True)})
    client.close()

    sent = send_events(pipeline_settings, 200)
    bp = background_pipeline(pipeline_settings)
    recs = collect(pipeline_settings, expected=200)
    bp.stop()

    assert {r["event_id"] for r in recs} == sent.ids and len(recs) == 200
    by_id = {r["event_id"]: r for r in sent.records}
    for rec in recs:
        assert all(math.isfinite(i["score"]) for i in rec["items"])
        assert "item_features" in rec["fallback_features"]  # every item was poisoned
        if by_id[rec["event_id"]]["user_id"] in poisoned_users:
            assert "user_features" in rec["fallback_features"]
