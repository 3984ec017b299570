"""FeatureEnricher against the real Redis of the local stack (and Redis servers of its own)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import redis

from pipeline.connectors.redis.feature_store import FeatureStoreWriter, item_key, user_key
from pipeline.observability.metrics import Metrics
from pipeline.settings.redis import RedisSettings
from pipeline.stages.enrich import enricher as enricher_mod
from pipeline.stages.enrich.enricher import FeatureEnricher, _distinct
from pipeline.types import Enrichment
from tests.pipeline.connectors.redis.redis_spy import spy_on_every_connection

USER_DIM = 4
ITEM_DIM = 3
RECENT_CAP = 64  # above every stored list but one test's

CountingRedis = Any  # tests/pipeline/conftest.py: redis.Redis that records its commands


class FakeClock:
    """Replaces ``time`` inside ``pipeline.stages.enrich.enricher`` only (monotonic is all it
    uses)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(enricher_mod, "time", fake)
    return fake


class Features:
    """What a test wrote to Redis, to compare against."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.user_ids = np.array([1, 2, 3, 10**15], dtype=np.int64)
        self.user_dense = rng.standard_normal((len(self.user_ids), USER_DIM)).astype(np.float32)
        self.user_recent = [[11, 12, 13], [], [99], list(range(500, 530))]
        self.item_ids = np.arange(100, 150, dtype=np.int64)
        self.item_category = rng.integers(1, 10**12, len(self.item_ids)).astype(np.int64)
        self.item_dense = rng.standard_normal((len(self.item_ids), ITEM_DIM)).astype(np.float32)

    def write(self, client: redis.Redis, prefix: str) -> None:
        writer = FeatureStoreWriter(client, prefix)
        writer.write_users(self.user_ids, self.user_dense, self.user_recent)
        writer.write_items(self.item_ids, self.item_category, self.item_dense)

    def user(self, user_id: int) -> tuple[np.ndarray, list[int]]:
        k = int(np.flatnonzero(self.user_ids == user_id)[0])
        return self.user_dense[k], self.user_recent[k]

    def item(self, item_id: int) -> tuple[int, np.ndarray]:
        k = int(np.flatnonzero(self.item_ids == item_id)[0])
        return int(self.item_category[k]), self.item_dense[k]


def recent_of(out: Enrichment, event: int) -> list[int]:
    """The stored recent items of one event's user, from the flat columns."""
    start = int(out.user_recent_counts[:event].sum())
    return out.user_recent_ids[start : start + int(out.user_recent_counts[event])].tolist()


def assert_enrichment(
    out: Enrichment, feats: Features, user_ids: list[int], item_ids: list[int]
) -> None:
    """Every row equals what was written, or defaults + missing flag for unknown ids."""
    assert out.user_dense.shape == (len(user_ids), USER_DIM)
    assert out.user_dense.dtype == np.float32
    assert out.user_recent_counts.shape == (len(user_ids),)
    assert out.user_missing.dtype == np.bool_
    assert out.item_dense.shape == (len(item_ids), ITEM_DIM)
    assert out.item_dense.dtype == np.float32
    assert out.item_category.shape == (len(item_ids),)
    for e, u in enumerate(user_ids):
        if u in feats.user_ids:
            dense, recent = feats.user(u)
            np.testing.assert_array_equal(out.user_dense[e], dense)
            assert recent_of(out, e) == recent
            assert not out.user_missing[e], f"user {u}"
        else:
            np.testing.assert_array_equal(out.user_dense[e], np.zeros(USER_DIM))
            assert recent_of(out, e) == []
            assert out.user_missing[e], f"user {u}"
    for r, i in enumerate(item_ids):
        if i in feats.item_ids:
            category, dense = feats.item(i)
            assert int(out.item_category[r]) == category
            np.testing.assert_array_equal(out.item_dense[r], dense)
            assert not out.item_missing[r], f"item {i}"
        else:
            assert int(out.item_category[r]) == 0
            np.testing.assert_array_equal(out.item_dense[r], np.zeros(ITEM_DIM))
            assert out.item_missing[r], f"item {i}"


def _enrich(enricher: FeatureEnricher, users: list[int], items: list[int]) -> Enrichment:
    return enricher.enrich(np.array(users, dtype=np.int64), np.array(items, dtype=np.int64))


def _cache_count(metrics: Metrics, kind: str, result: str) -> float:
    value = metrics.registry.get_sample_value(
        "streamrank_feature_cache_requests_total", {"kind": kind, "result": result}
    )
    return value or 0.0


@pytest.fixture
def feats(redis_client: redis.Redis, redis_settings: RedisSettings) -> Features:
    features = Features()
    features.write(redis_client, redis_settings.key_prefix)
    return features


@pytest.fixture
def make_enricher(
    redis_settings: RedisSettings, counting_redis: CountingRedis
) -> Callable[..., tuple[FeatureEnricher, Metrics]]:
    def make(**overrides: Any) -> tuple[FeatureEnricher, Metrics]:
        settings = redis_settings.model_copy(update=overrides)
        metrics = Metrics()
        enricher = FeatureEnricher(
            settings, USER_DIM, ITEM_DIM, RECENT_CAP, metrics, client=counting_redis
        )
        counting_redis.ping()  # connect now, so only enrich's commands are counted below
        counting_redis.reset()
        return enricher, metrics

    return make


# --------------------------------------------------------------------------------- values --


def test_values_equal_what_was_written(feats: Features, make_enricher: Any) -> None:
    enricher, _ = make_enricher()
    users = [3, 1, 10**15]
    items = [149, 100, 101, 120, 121, 122]
    out = _enrich(enricher, users, items)
    assert_enrichment(out, feats, users, items)
    assert not out.user_missing.any()
    assert not out.item_missing.any()


def test_duplicate_ids_in_a_batch(feats: Features, make_enricher: Any) -> None:
    enricher, _ = make_enricher()
    users = [2, 1, 2, 2, 1]
    items = [105, 100, 105, 105, 101, 100, 199_999, 199_999]
    out = _enrich(enricher, users, items)
    assert_enrichment(out, feats, users, items)


def test_missing_users_and_items_get_defaults_and_flags(
    feats: Features, make_enricher: Any
) -> None:
    enricher, _ = make_enricher()
    users = [1, 777, 2]
    items = [100, 5_000_000, 101, 5_000_001]
    out = _enrich(enricher, users, items)
    assert_enrichment(out, feats, users, items)
    assert out.user_missing.tolist() == [False, True, False]
    assert out.item_missing.tolist() == [False, True, False, True]


def test_results_are_independent_copies(feats: Features, make_enricher: Any) -> None:
    enricher, _ = make_enricher()
    first = _enrich(enricher, [1], [100, 101])
    first.user_dense[:] = -1
    first.item_dense[:] = -1
    first.item_category[:] = -1
    second = _enrich(enricher, [1], [100, 101])  # served from the cache
    assert_enrichment(second, feats, [1], [100, 101])


# ----------------------------------------------------------------------------- round trips --


def test_exactly_one_mget_per_enrich_call(
    feats: Features, make_enricher: Any, counting_redis: CountingRedis
) -> None:
    enricher, _ = make_enricher()
    users = [1, 2, 1, 424242]
    items = [100, 101, 102, 100, 9_999_999]
    _enrich(enricher, users, items)
    assert counting_redis.commands == ["MGET"]
    assert counting_redis.key_counts == [3 + 4]  # unique users + unique items


def test_one_round_trip_seen_by_the_server(
    redis_server_factory: Callable[[], Any], redis_settings: RedisSettings
) -> None:
    server = redis_server_factory()
    admin = redis.Redis.from_url(server.url)
    feats = Features()
    feats.write(admin, "sr")
    settings = redis_settings.model_copy(update={"url": server.url, "key_prefix": "sr"})
    enricher = FeatureEnricher(settings, USER_DIM, ITEM_DIM, RECENT_CAP, Metrics())
    admin.config_resetstat()
    users = [1, 2, 3, 1]
    items = [*range(100, 150), 100, 101]
    out = _enrich(enricher, users, items)
    stats = admin.info("commandstats")
    admin.close()
    assert_enrichment(out, feats, users, items)
    admin_commands = {"cmdstat_info", "cmdstat_config", "cmdstat_client", "cmdstat_hello"}
    data_commands = {
        name: s["calls"] for name, s in stats.items() if name.split("|")[0] not in admin_commands
    }
    assert data_commands == {"cmdstat_mget": 1}


def test_second_call_fully_cached_sends_nothing(
    feats: Features, make_enricher: Any, counting_redis: CountingRedis
) -> None:
    enricher, metrics = make_enricher()
    users, items = [1, 2, 2], [100, 101, 102, 101]
    _enrich(enricher, users, items)
    assert _cache_count(metrics, "user", "miss") == 2
    assert _cache_count(metrics, "item", "miss") == 3
    assert _cache_count(metrics, "user", "hit") == 0
    counting_redis.reset()

    out = _enrich(enricher, users, items)
    assert counting_redis.commands == []
    assert_enrichment(out, feats, users, items)
    assert _cache_count(metrics, "user", "hit") == 2
    assert _cache_count(metrics, "item", "hit") == 3
    assert _cache_count(metrics, "user", "miss") == 2  # unchanged
    ratio = metrics.registry.get_sample_value("streamrank_feature_cache_hit_ratio")
    assert ratio == pytest.approx(5 / 10)


def test_partially_cached_fetches_only_the_rest(
    feats: Features, make_enricher: Any, counting_redis: CountingRedis
) -> None:
    enricher, _ = make_enricher()
    _enrich(enricher, [1], [100, 101])
    counting_redis.reset()
    users, items = [1, 2], [100, 101, 102, 103]
    out = _enrich(enricher, users, items)
    assert counting_redis.commands == ["MGET"]
    assert counting_redis.key_counts == [1 + 2]
    assert_enrichment(out, feats, users, items)


def test_misses_are_not_cached(
    feats: Features,
    make_enricher: Any,
    counting_redis: CountingRedis,
    redis_client: redis.Redis,
    redis_settings: RedisSettings,
) -> None:
    enricher, _ = make_enricher()
    out = _enrich(enricher, [555], [100, 7777])
    assert out.user_missing.tolist() == [True]
    assert out.item_missing.tolist() == [False, True]
    counting_redis.reset()

    # They appear in Redis later: the next batch must see them.
    writer = FeatureStoreWriter(redis_client, redis_settings.key_prefix)
    user_dense = np.full((1, USER_DIM), 0.5, dtype=np.float32)
    item_dense = np.full((1, ITEM_DIM), -2.0, dtype=np.float32)
    writer.write_users(np.array([555]), user_dense, [[1, 2]])
    writer.write_items(np.array([7777]), np.array([31]), item_dense)

    out = _enrich(enricher, [555], [100, 7777])
    assert counting_redis.commands == ["MGET"]
    assert counting_redis.key_counts == [2]  # item 100 came from the cache
    assert out.user_missing.tolist() == [False]
    assert out.item_missing.tolist() == [False, False]
    np.testing.assert_array_equal(out.user_dense, user_dense)
    assert recent_of(out, 0) == [1, 2]
    assert out.item_category.tolist() == [feats.item(100)[0], 31]
    np.testing.assert_array_equal(out.item_dense[1], item_dense[0])


def test_cache_ttl_expiry(
    feats: Features,
    make_enricher: Any,
    counting_redis: CountingRedis,
    clock: FakeClock,
    redis_client: redis.Redis,
    redis_settings: RedisSettings,
) -> None:
    enricher, metrics = make_enricher(cache_ttl_s=5.0)
    _enrich(enricher, [1], [100])
    # Redis changes behind the cache.
    updated = Features(seed=9)
    updated.user_ids = np.array([1], dtype=np.int64)
    updated.user_dense = updated.user_dense[:1]
    updated.user_recent = [[4242]]
    updated.item_ids = np.array([100], dtype=np.int64)
    updated.item_category = updated.item_category[:1]
    updated.item_dense = updated.item_dense[:1]
    updated.write(redis_client, redis_settings.key_prefix)
    counting_redis.reset()

    clock.advance(4.9)
    out = _enrich(enricher, [1], [100])
    assert counting_redis.commands == []
    assert_enrichment(out, feats, [1], [100])  # still the cached (old) values

    clock.advance(0.2)  # 5.1 s after caching: expired
    out = _enrich(enricher, [1], [100])
    assert counting_redis.commands == ["MGET"]
    assert_enrichment(out, updated, [1], [100])
    assert _cache_count(metrics, "user", "miss") == 2

    counting_redis.reset()
    clock.advance(1.0)  # freshly cached again
    _enrich(enricher, [1], [100])
    assert counting_redis.commands == []


def test_tiny_cache_still_returns_correct_values(
    feats: Features, make_enricher: Any, counting_redis: CountingRedis
) -> None:
    enricher, _ = make_enricher(cache_max_entries=3)
    rng = np.random.default_rng(5)
    for _ in range(4):
        items = [*rng.choice(feats.item_ids, 50).tolist(), 123_456]
        users = rng.choice(np.append(feats.user_ids, 31337), 8).tolist()
        out = _enrich(enricher, users, items)
        assert_enrichment(out, feats, users, items)
    counting_redis.reset()
    # A batch that fits the cache is served from it after one fetch.
    _enrich(enricher, [1], [100, 101, 102])
    counting_redis.reset()
    out = _enrich(enricher, [1], [100, 101, 102])
    assert counting_redis.commands == []
    assert_enrichment(out, feats, [1], [100, 101, 102])


def test_cache_of_one_entry(feats: Features, make_enricher: Any) -> None:
    enricher, _ = make_enricher(cache_max_entries=1)
    for _ in range(3):
        out = _enrich(enricher, [1, 2, 3], [100, 101, 100, 149])
        assert_enrichment(out, feats, [1, 2, 3], [100, 101, 100, 149])


# ------------------------------------------------------------------------------- malformed --


def test_malformed_values_fall_back_without_exception(
    feats: Features,
    make_enricher: Any,
    redis_client: redis.Redis,
    redis_settings: RedisSettings,
) -> None:
    prefix = redis_settings.key_prefix
    good_user = feats.user_dense[0].tobytes()
    redis_client.mset(
        {
            user_key(prefix, 900): b"\x01\x02",  # shorter than the dense vector
            user_key(prefix, 901): good_user + b"\x00\x00\x00",  # recent not a multiple of 8
            item_key(prefix, 9000): b"\x00" * 5,  # wrong length
            item_key(prefix, 9001): b"\x00" * (8 + 4 * ITEM_DIM + 1),
            item_key(prefix, 9002): b"",
        }
    )
    enricher, _ = make_enricher()
    users = [900, 1, 901]
    items = [9000, 100, 9001, 101, 9002]
    out = _enrich(enricher, users, items)
    assert_enrichment(out, feats, users, items)
    assert out.user_missing.tolist() == [True, False, True]
    assert out.item_missing.tolist() == [True, False, True, False, True]


def test_a_value_over_the_cap_is_a_miss_and_never_joined(
    feats: Features,
    make_enricher: Any,
    redis_client: redis.Redis,
    redis_settings: RedisSettings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A well-formed user value (dense vector and 2,000 recent items) over
    ``redis.max_value_bytes`` falls back to the defaults like a miss, is logged, and takes
    no room in the buffer the values are parsed from."""
    prefix = redis_settings.key_prefix
    long_user = feats.user_dense[0].tobytes() + np.arange(2000, dtype="<i8").tobytes()
    redis_client.set(user_key(prefix, 902), long_user)
    enricher, _ = make_enricher(max_value_bytes=len(long_user) - 1)
    joined: list[int] = []
    join = enricher_mod._joined_words
    monkeypatch.setattr(
        enricher_mod, "_joined_words", lambda v, g: joined.append(int(g.sum())) or join(v, g)
    )
    users = [902, 1]
    out = _enrich(enricher, users, [100])
    assert out.user_missing.tolist() == [True, False]
    assert_enrichment(out, feats, users, [100])
    assert joined[0] == 1  # the users' join held user 1's value only
    assert "1 user feature values over redis.max_value_bytes" in caplog.text
    enricher, _ = make_enricher(max_value_bytes=len(long_user))  # at the cap: served
    assert _enrich(enricher, [902], [100]).user_missing.tolist() == [False]


def test_user_without_recent_items_is_not_malformed(
    make_enricher: Any, redis_client: redis.Redis, redis_settings: RedisSettings
) -> None:
    dense = np.arange(USER_DIM, dtype=np.float32)
    redis_client.set(user_key(redis_settings.key_prefix, 5), dense.tobytes())
    enricher, _ = make_enricher()
    out = _enrich(enricher, [5], [100])
    assert out.user_missing.tolist() == [False]
    np.testing.assert_array_equal(out.user_dense[0], dense)
    assert recent_of(out, 0) == []


# --------------------------------------------------------------------------------- outages --


@pytest.fixture
def outage_setup(
    redis_server_factory: Callable[[], Any],
    redis_settings: RedisSettings,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Any, FeatureEnricher, Features, list[str]]]:
    """An own Redis with features, an enricher that built its OWN client, and a command log."""
    server = redis_server_factory()
    admin = redis.Redis.from_url(server.url)
    feats = Features()
    feats.write(admin, "sr")
    admin.close()
    settings = redis_settings.model_copy(
        update={
            "url": server.url,
            "key_prefix": "sr",
            "socket_timeout_ms": 200,
            "connect_timeout_ms": 200,
            "retry_after_s": 2.0,
        }
    )
    sent = spy_on_every_connection(monkeypatch)
    enricher = FeatureEnricher(settings, USER_DIM, ITEM_DIM, RECENT_CAP, Metrics())
    try:
        yield server, enricher, feats, sent
    finally:
        if server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGCONT)


@pytest.fixture
def socket_waits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float | None]]:
    """Every blocking socket step of a redis client, with the timeout that bounds it:
    ``("connect", connect timeout)`` and ``("read", socket timeout)``. How long an enrich can
    block follows from these (no wall-clock measurement)."""
    waits: list[tuple[str, float | None]] = []
    real_connect = redis.connection.Connection._connect
    real_read = redis.connection.AbstractConnection.read_response

    def connect(self: redis.connection.Connection) -> Any:
        waits.append(("connect", self.socket_connect_timeout))
        return real_connect(self)

    def read_response(self: redis.connection.AbstractConnection, *args: Any, **kw: Any) -> Any:
        waits.append(("read", self.socket_timeout))
        return real_read(self, *args, **kw)

    monkeypatch.setattr(redis.connection.Connection, "_connect", connect)
    monkeypatch.setattr(redis.connection.AbstractConnection, "read_response", read_response)
    return waits


USERS = [1, 2, 2]
ITEMS = [100, 101, 149, 100]


def _assert_all_defaults(out: Enrichment) -> None:
    assert out.user_missing.all()
    assert out.item_missing.all()
    assert not out.user_dense.any()
    assert not out.item_dense.any()
    assert not out.item_category.any()
    assert not out.user_recent_counts.any() and out.user_recent_ids.size == 0


def test_outage_dead_server_serves_defaults_quickly(
    outage_setup: tuple[Any, FeatureEnricher, Features, list[str]],
    clock: FakeClock,
    socket_waits: list[tuple[str, float | None]],
) -> None:
    server, enricher, _, sent = outage_setup
    server.stop()

    out = _enrich(enricher, USERS, ITEMS)
    _assert_all_defaults(out)
    assert sent == ["MGET"]
    # Connection refused is immediate; nothing may add retries/backoff on top of that: one
    # connect attempt, bounded by the configured 200 ms, and nothing read.
    assert socket_waits == [("connect", 0.2)]

    sent.clear()
    socket_waits.clear()
    clock.advance(1.9)  # within retry_after_s: Redis is left alone
    out = _enrich(enricher, USERS, ITEMS)
    _assert_all_defaults(out)
    assert sent == [] and socket_waits == []  # no socket touched: nothing to wait for


def test_outage_hung_server_then_recovery(
    outage_setup: tuple[Any, FeatureEnricher, Features, list[str]],
    clock: FakeClock,
    socket_waits: list[tuple[str, float | None]],
) -> None:
    server, enricher, feats, sent = outage_setup
    os.kill(server.process.pid, signal.SIGSTOP)  # accepts connections, never answers
    try:
        out = _enrich(enricher, USERS, ITEMS)
        _assert_all_defaults(out)
        # Bounded by the configured 200 ms timeouts: a connect and a read at most, no retry.
        assert socket_waits in (
            [("read", 0.2)],  # the pooled connection of the setup is reused
            [("connect", 0.2), ("read", 0.2)],
        ), socket_waits

        sent.clear()
        socket_waits.clear()
        clock.advance(1.0)
        out = _enrich(enricher, USERS, ITEMS)
        _assert_all_defaults(out)
        # retry_after_s stops us waiting for the socket timeout again: no socket touched.
        assert sent == [] and socket_waits == []
    finally:
        os.kill(server.process.pid, signal.SIGCONT)

    clock.advance(1.5)  # 2.5 s after the failure > retry_after_s
    out = _enrich(enricher, USERS, ITEMS)
    assert sent == ["MGET"]
    assert_enrichment(out, feats, USERS, ITEMS)
    assert not out.user_missing.any()
    assert not out.item_missing.any()


def test_outage_defaults_are_not_cached(
    outage_setup: tuple[Any, FeatureEnricher, Features, list[str]], clock: FakeClock
) -> None:
    server, enricher, feats, sent = outage_setup
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        _assert_all_defaults(_enrich(enricher, USERS, ITEMS))
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    clock.advance(2.1)
    assert_enrichment(_enrich(enricher, USERS, ITEMS), feats, USERS, ITEMS)
    sent.clear()
    assert_enrichment(_enrich(enricher, USERS, ITEMS), feats, USERS, ITEMS)
    assert sent == []  # now cached


def test_stored_recent_items_beyond_the_cap_are_dropped(
    make_enricher: Any, redis_client: redis.Redis, redis_settings: RedisSettings
) -> None:
    settings = redis_settings.model_copy(update={"cache_ttl_s": 60.0})
    writer = FeatureStoreWriter(redis_client, settings.key_prefix)
    writer.write_users(np.array([321]), np.zeros((1, USER_DIM), np.float32), [list(range(100))])
    enricher = FeatureEnricher(settings, USER_DIM, ITEM_DIM, 5, Metrics())
    for _ in range(2):  # from Redis, then from the cache
        out = _enrich(enricher, [321, 321], [100])
        assert out.user_recent_counts.tolist() == [5, 5]
        assert out.user_recent_ids.tolist() == [0, 1, 2, 3, 4] * 2


def test_the_distinct_ids_of_the_missed_rows_and_where_each_row_finds_its_own() -> None:
    rng = np.random.default_rng(7)
    for size in (1, 5, 62, 3000):
        ids = rng.integers(-50, 200, size)
        rows = np.sort(rng.choice(size, rng.integers(1, size + 1), replace=False))
        todo, source = _distinct(ids, rows)
        expected_todo, expected_source = np.unique(ids[rows], return_inverse=True)
        np.testing.assert_array_equal(todo, expected_todo)
        np.testing.assert_array_equal(source, expected_source.reshape(-1))
    empty = np.zeros(0, dtype=np.int64)
    assert [len(part) for part in _distinct(np.arange(3), empty)] == [0, 0]
