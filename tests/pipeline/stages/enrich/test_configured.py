"""ConfiguredEnricher against the real Redis of the local stack: key templates, hashes and the
packed layout read in one send, each absent or malformed field marked absent alone (the
record's other fields serve), the cache (records cached with which fields they hold, wholly
missing ones never), an outage."""

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


def test_hash_records_are_read_in_one_send_and_bad_fields_are_absent_alone(
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
    redis_client.hset(f"{prefix}:v:6:h", mapping={"taste": np.array([1, 2], "<f4").tobytes()})
    redis_client.hset(f"{prefix}:v:7:h", mapping={"segment": "n/a", "recent": b"\x01\x02"})
    sent = spy_on_every_connection(monkeypatch)
    metrics = Metrics()
    enricher = ConfiguredEnricher(redis_settings, _map(user, item), metrics)
    users = np.array([1, 2, -3, 4, 5, 1, 6, 7], dtype=np.int64)
    items = np.array([100, 101, 102, 103, 100], dtype=np.int64)
    got = enricher.enrich(users, items)
    assert sent == ["HMGET"]  # 7 users' and 4 items' HMGETs in one buffer: one send
    assert got.user_fields is not None and got.item_fields is not None
    # 4: its taste is malformed; 5: no record; 6: only a taste; 7: all three malformed.
    want_missing = [False, False, False, True, True, False, True, True]
    np.testing.assert_array_equal(got.user_missing, want_missing)
    np.testing.assert_array_equal(got.user_fields.ints[:, 0], [7, -4, 9, 1, 0, 7, 0, 0])
    np.testing.assert_array_equal(
        got.user_fields.int_present[:, 0], [True, True, True, True, False, True, False, False]
    )
    np.testing.assert_allclose(got.user_fields.floats[0], [0.5, -1.0])
    np.testing.assert_allclose(got.user_fields.floats[6], [1.0, 2.0])
    assert np.isnan(got.user_fields.floats[[3, 4, 7]]).all()  # absent vectors are NaN
    np.testing.assert_array_equal(got.user_fields.list_counts[:, 0], [3, 0, 1, 0, 0, 3, 0, 0])
    np.testing.assert_array_equal(  # 4's empty list is present: an empty bag, no miss
        got.user_fields.list_present[:, 0], [True, True, True, True, False, True, False, False]
    )
    np.testing.assert_array_equal(got.user_fields.list_ids, [11, 12, 13, 5, 11, 12, 13])
    np.testing.assert_array_equal(got.item_missing, [False, False, True, True, False])
    np.testing.assert_allclose(got.item_fields.floats[[0, 1, 4], 0], [0.25, 0.75, 0.25])
    assert np.isnan(got.item_fields.floats[[2, 3], 0]).all()
    # Records with a field are cached with which they hold; those with none (users 5 and 7,
    # items 102 and 103) are asked again.
    sent.clear()
    again = enricher.enrich(users, items)
    assert sent == ["HMGET"]  # one buffer for the misses only
    miss = "streamrank_feature_cache_requests_total"
    value = metrics.registry.get_sample_value
    assert value(miss, {"kind": "user", "result": "miss"}) == 7 + 2
    assert value(miss, {"kind": "item", "result": "miss"}) == 4 + 2
    for name in ("ints", "floats", "list_counts", "list_ids", "int_present", "list_present"):
        np.testing.assert_array_equal(
            getattr(again.user_fields, name), getattr(got.user_fields, name), name
        )
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
    redis_client.set(f"{prefix}:l:4", nan)  # a non-finite value: the vector alone is absent
    enricher = ConfiguredEnricher(redis_settings, _map(user, item), Metrics())
    got = enricher.enrich(np.array([8, 9, 10], np.int64), np.array([3, 4, 3], np.int64))
    assert got.user_fields is not None and got.item_fields is not None
    np.testing.assert_array_equal(got.user_missing, [False, True, True])
    np.testing.assert_allclose(got.user_fields.floats[0], profile)
    assert np.isnan(got.user_fields.floats[1:]).all()  # not the layout's shape: all absent
    np.testing.assert_array_equal(got.user_fields.list_present[:, 0], [True, False, False])
    np.testing.assert_array_equal(got.user_fields.list_ids, [4, 5])  # the cap: 2
    np.testing.assert_array_equal(got.item_missing, [False, True, False])
    np.testing.assert_array_equal(got.item_fields.ints[:, 0], [-77, 7, -77])
    np.testing.assert_array_equal(got.item_fields.int_present[:, 0], [True, True, True])
    np.testing.assert_allclose(got.item_fields.floats[2], [0.5, 1.0])
    assert np.isnan(got.item_fields.floats[1]).all()


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
    assert not down.user_fields.int_present.any() and not down.user_fields.list_present.any()
    assert np.isnan(down.user_fields.floats).all()
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
    assert got.user_fields is not None  # only that field is absent
    np.testing.assert_array_equal(got.user_fields.list_present[:, 0], [True, False])
    np.testing.assert_array_equal(got.user_fields.int_present[:, 0], [True, True])


def test_an_id_list_serves_with_its_weights_one_per_id_or_not_at_all(
    redis_client: redis.Redis, redis_settings: RedisSettings, prefix: str
) -> None:
    user = RecordLayout(
        f"{prefix}:w:{{id}}",
        RecordFormat.HASH,
        (
            RecordField("taste", RecordKind.VECTOR, 1, 0),
            RecordField("tags", RecordKind.ID_LIST, 3, 0),
            RecordField("tag_weights", RecordKind.WEIGHTS, 3, 1, pairs=0),
            RecordField("seen", RecordKind.ID_LIST, 2, 1),
        ),
    )
    write_hashes(
        redis_client,
        user,
        [1, 2],
        [
            {
                "taste": [1.0],
                "tags": [4, 5, 6, 7],
                "tag_weights": [0.5, 1.5, 2.5, 3.5],
                "seen": [9],
            },
            {"taste": [2.0], "tags": [], "tag_weights": [], "seen": [8, 7]},
        ],
    )
    key = f"{prefix}:w:{{}}"
    f4 = np.array([0.5, 2.0], "<f4").tobytes()
    redis_client.hset(
        key.format(3), mapping={"tags": np.array([4, 5, 6], "<i8").tobytes(), "tag_weights": f4}
    )
    redis_client.hset(key.format(4), mapping={"tags": np.array([4], "<i8").tobytes(), "seen": b""})
    redis_client.hset(
        key.format(5),
        mapping={
            "tags": np.array([1], "<i8").tobytes(),
            "tag_weights": np.array([np.nan], "<f4").tobytes(),
        },
    )
    enricher = ConfiguredEnricher(redis_settings, _map(user, None), Metrics())
    users = np.array([1, 2, 3, 4, 5, 1], dtype=np.int64)
    for _ in range(2):  # read, then served from the cache
        fields = enricher.enrich(users, np.zeros(0, np.int64)).user_fields
        assert fields is not None and fields.list_weights is not None
        # 3: two weights for three ids, 4: no weights, 5: a weight not finite: no tags
        np.testing.assert_array_equal(fields.list_present[:, 0], [1, 1, 0, 0, 0, 1])
        np.testing.assert_array_equal(fields.list_counts[:, 0], [3, 0, 0, 0, 0, 3])
        np.testing.assert_array_equal(fields.list_ids, [4, 5, 6, 9, 8, 7, 4, 5, 6, 9])
        np.testing.assert_allclose(
            fields.list_weights, [0.5, 1.5, 2.5, 1.0, 1.0, 1.0, 0.5, 1.5, 2.5, 1.0]
        )
        assert np.isnan(fields.floats[2:5, 1:]).all()  # the absent weights' columns
