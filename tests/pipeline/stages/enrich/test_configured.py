"""ConfiguredEnricher against the real Redis of the local stack: key templates, hashes and the
packed layout read in one send, bad records falling back alone, the cache, an outage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import redis

from model.features.mapping import FeatureMap, RecordField, RecordKind, RecordLayout
from pipeline.connectors.redis.layout import write_hashes
from pipeline.observability.metrics import Metrics
from pipeline.settings.features import RecordFormat
from pipeline.settings.redis import RedisSettings
from pipeline.stages.enrich.configured import ConfiguredEnricher
from tests.pipeline.connectors.redis.redis_spy import spy_on_every_connection

pytestmark = pytest.mark.integration


def _layout(key: str, fmt: RecordFormat, *fields: tuple[str, RecordKind, int, int]) -> RecordLayout:
    return RecordLayout(key, fmt, tuple(RecordField(*f) for f in fields))


def _map(user: RecordLayout | None, item: RecordLayout | None) -> FeatureMap:
    return FeatureMap(None, "", None, (), user, item, (), ())  # type: ignore[arg-type]


@pytest.fixture
def prefix(unique_name: Callable[[str], str]) -> str:
    return unique_name("cfg")


@pytest.fixture
def redis_settings(local_stack: Any) -> RedisSettings:
    return RedisSettings(url=local_stack.redis_url, cache_ttl_s=60.0)


def _hash_layouts(prefix: str) -> tuple[RecordLayout, RecordLayout]:
    user = _layout(
        f"{prefix}:v:{{id}}:h",
        RecordFormat.HASH,
        ("taste", RecordKind.VECTOR, 2, 0),
        ("segment", RecordKind.ID, 1, 0),
        ("recent", RecordKind.ID_LIST, 3, 0),
    )
    item = _layout(f"{prefix}:o:{{id}}", RecordFormat.HASH, ("stats", RecordKind.VECTOR, 1, 0))
    return user, item


def test_hash_records_are_read_in_one_send_and_bad_ones_fall_back_alone(
    redis_client: redis.Redis,
    redis_settings: RedisSettings,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user, item = _hash_layouts(prefix)
    write_hashes(
        redis_client,
        user,
        [1, 2, -3],
        [
            {"taste": [0.5, -1.0], "segment": 7, "recent": [11, 12, 13, 14]},
            {"taste": [2.0, 3.0], "segment": -4, "recent": []},
            {"taste": [1.5, 1.5], "segment": 9, "recent": [5]},
        ],
    )
    write_hashes(redis_client, item, [100, 101], [{"stats": [0.25]}, {"stats": [0.75]}])
    redis_client.hset(f"{prefix}:v:4:h", mapping={"taste": b"short", "segment": "1", "recent": b""})
    redis_client.set(f"{prefix}:o:102", b"a string, not a hash")  # WRONGTYPE for HMGET
    sent = spy_on_every_connection(monkeypatch)
    enricher = ConfiguredEnricher(redis_settings, _map(user, item), Metrics())
    users = np.array([1, 2, -3, 4, 5, 1], dtype=np.int64)
    items = np.array([100, 101, 102, 103, 100], dtype=np.int64)
    got = enricher.enrich(users, items)
    assert sent == ["HMGET"]  # 5 users' and 4 items' HMGETs in one buffer: one send
    assert got.user_fields is not None and got.item_fields is not None
    np.testing.assert_array_equal(got.user_missing, [False, False, False, True, True, False])
    np.testing.assert_array_equal(got.user_fields.ints[:, 0], [7, -4, 9, 0, 0, 7])
    np.testing.assert_allclose(got.user_fields.floats[0], [0.5, -1.0])
    np.testing.assert_array_equal(got.user_fields.list_counts[:, 0], [3, 0, 1, 0, 0, 3])
    np.testing.assert_array_equal(got.user_fields.list_ids, [11, 12, 13, 5, 11, 12, 13])
    np.testing.assert_array_equal(got.item_missing, [False, False, True, True, False])
    np.testing.assert_allclose(got.item_fields.floats[:, 0], [0.25, 0.75, 0, 0, 0.25])
    # Good records are cached; missing ones are asked again.
    sent.clear()
    again = enricher.enrich(users, items)
    assert sent == ["HMGET"]  # one buffer for the misses only
    np.testing.assert_array_equal(again.user_missing, got.user_missing)


def test_packed_records_follow_the_key_template(
    redis_client: redis.Redis, redis_settings: RedisSettings, prefix: str
) -> None:
    user = _layout(
        f"{prefix}:s:{{id}}",
        RecordFormat.PACKED,
        ("profile", RecordKind.VECTOR, 3, 0),
        ("recent", RecordKind.ID_LIST, 2, 0),
    )
    item = _layout(
        f"{prefix}:l:{{id}}",
        RecordFormat.PACKED,
        ("category", RecordKind.ID, 1, 0),
        ("quality", RecordKind.VECTOR, 2, 0),
    )
    profile = np.array([1, 2, 3], "<f4")
    redis_client.set(f"{prefix}:s:8", profile.tobytes() + np.array([4, 5, 6], "<i8").tobytes())
    redis_client.set(f"{prefix}:s:9", profile.tobytes() + b"\x01")  # not whole int64s
    redis_client.set(
        f"{prefix}:l:3", np.array([-77], "<i8").tobytes() + np.array([0.5, 1], "<f4").tobytes()
    )
    nan = np.array([7], "<i8").tobytes() + np.array([np.nan, 1], "<f4").tobytes()
    redis_client.set(f"{prefix}:l:4", nan)  # a non-finite value: the record falls back
    enricher = ConfiguredEnricher(redis_settings, _map(user, item), Metrics())
    got = enricher.enrich(np.array([8, 9], np.int64), np.array([3, 4, 3], np.int64))
    assert got.user_fields is not None and got.item_fields is not None
    np.testing.assert_array_equal(got.user_missing, [False, True])
    np.testing.assert_allclose(got.user_fields.floats[0], profile)
    np.testing.assert_array_equal(got.user_fields.list_ids, [4, 5])  # the cap: 2
    np.testing.assert_array_equal(got.item_missing, [False, True, False])
    np.testing.assert_array_equal(got.item_fields.ints[:, 0], [-77, 0, -77])
    np.testing.assert_allclose(got.item_fields.floats[2], [0.5, 1.0])


def test_an_outage_serves_defaults_flagged_and_recovers(
    redis_server_factory: Callable[[], Any], prefix: str
) -> None:
    server = redis_server_factory()
    user, _ = _hash_layouts(prefix)
    client = redis.Redis.from_url(server.url)
    write_hashes(client, user, [1], [{"taste": [1.0, 2.0], "segment": 3, "recent": [8]}])
    settings = RedisSettings(url=server.url, retry_after_s=0.0, cache_ttl_s=0.0)
    enricher = ConfiguredEnricher(settings, _map(user, None), Metrics())
    assert not enricher.enrich(np.array([1]), np.array([5])).user_missing[0]
    server.stop()
    down = enricher.enrich(np.array([1]), np.array([5]))
    assert down.user_missing[0] and down.user_fields is not None
    assert down.user_fields.ints[0, 0] == 0 and not down.item_missing.any()
    server.restart()
    write_hashes(
        redis.Redis.from_url(server.url),
        user,
        [1],
        [{"taste": [1.0, 2.0], "segment": 3, "recent": [8]}],
    )
    back = enricher.enrich(np.array([1]), np.array([5]))
    assert not back.user_missing[0] and back.user_fields is not None
    assert back.user_fields.ints[0, 0] == 3
    client.close()


def test_a_side_without_a_layout_reads_nothing(
    redis_settings: RedisSettings, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, item = _hash_layouts(prefix)
    sent = spy_on_every_connection(monkeypatch)
    enricher = ConfiguredEnricher(redis_settings, _map(None, item), Metrics())
    got = enricher.enrich(np.array([1, 2]), np.array([], dtype=np.int64))
    assert sent == [] and got.user_fields is None and not got.user_missing.any()


def test_a_value_over_the_size_bound_is_missing_never_copied(
    redis_client: redis.Redis, redis_settings: RedisSettings, prefix: str
) -> None:
    user, _ = _hash_layouts(prefix)
    write_hashes(redis_client, user, [1], [{"taste": [1.0, 2.0], "segment": 3, "recent": [8]}])
    write_hashes(redis_client, user, [2], [{"taste": [1.0, 2.0], "segment": 3, "recent": [8] * 40}])
    bounded = redis_settings.model_copy(update={"max_value_bytes": 64})
    got = ConfiguredEnricher(bounded, _map(user, None), Metrics()).enrich(
        np.array([1, 2]), np.zeros(0, dtype=np.int64)
    )
    np.testing.assert_array_equal(got.user_missing, [False, True])  # 320 bytes of ids > 64
