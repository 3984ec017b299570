"""Enrichment: user and item features for a whole batch, in one Redis round trip.

For each batch the enricher takes the unique user and item ids, serves what it can from an
in-process TTL cache, and fetches the rest with ONE ``MGET`` (never a GET per event). Missing
keys, malformed values and Redis outages never lose an event: the features fall back to
defaults (zeros, no recent items, category 0) and the event's Recommendation lists the feature
group in ``fallback_features``. After an outage Redis is left alone for ``retry_after_s`` so a
dead server does not add its timeout to every batch.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pipeline.config import RedisSettings
from pipeline.feature_store import FLOAT32, INT64, item_key, item_record_dtype, user_key
from pipeline.metrics import Metrics
from pipeline.records import Enrichment
from pipeline.slot_table import SlotTable

log = logging.getLogger(__name__)


class BatchEnricher(Protocol):
    """What the loop needs of an enricher (:class:`FeatureEnricher`, or a fake in tests)."""

    def enrich(
        self, user_ids: npt.NDArray[np.int64], item_ids: npt.NDArray[np.int64]
    ) -> Enrichment: ...


class _SlotCache:
    """id -> slot map over fixed arrays; TTL per entry; oldest-inserted slot is reused first.

    Lookups are one compiled hash-table pass per batch (:class:`SlotTable`); TTL checks and
    payload gathers are numpy.
    """

    def __init__(self, capacity: int, ttl_s: float) -> None:
        self.capacity = max(1, capacity)
        self._ttl_s = ttl_s
        self._table = SlotTable(self.capacity)
        self._stored_at = np.zeros(self.capacity, dtype=np.float64)
        self._next = 0

    def lookup(self, ids: npt.NDArray[np.int64], now: float) -> npt.NDArray[np.int64]:
        """Slots of ``ids``; -1 where absent or expired."""
        slots = self._table.find(ids)
        found = slots >= 0
        expired = found.copy()
        expired[found] = self._stored_at[slots[found]] < now - self._ttl_s
        slots[expired] = -1
        return slots

    def allocate(self, ids: npt.NDArray[np.int64], now: float) -> npt.NDArray[np.int64]:
        """Slots for ``ids`` (evicting the oldest entries); the caller fills the payload."""
        if len(ids) > self.capacity:
            raise ValueError(f"{len(ids)} entries do not fit a cache of {self.capacity}")
        n = len(ids)
        slots = (self._next + np.arange(n)) % self.capacity
        self._next = (self._next + n) % self.capacity
        self._table.assign(ids, slots)
        self._stored_at[slots] = now
        return slots


class FeatureEnricher:
    """Reads user/item features for batches (see the module docstring).

    Args:
        settings: Redis URL, timeouts, cache size and TTL.
        user_dense_dim: length of the stored user vectors.
        item_dense_dim: length of the stored item vectors.
        recent_cap: stored recent items kept per user (the model's ``recent_items_cap``: an
            event's list never holds more).
        metrics: cache hit/miss and fallback counters.
        client: an existing Redis client (tests); built from ``settings.url`` otherwise.

    Example::

        enricher = FeatureEnricher(settings.redis, 8, 8, 20, Metrics())
        enrichment = enricher.enrich(user_ids, candidate_ids)
    """

    def __init__(
        self,
        settings: RedisSettings,
        user_dense_dim: int,
        item_dense_dim: int,
        recent_cap: int,
        metrics: Metrics,
        client: redis.Redis | None = None,
    ) -> None:
        self._settings = settings
        self._prefix = settings.key_prefix
        self._user_dim = user_dense_dim
        self._item_dtype = item_record_dtype(item_dense_dim)
        self._metrics = metrics
        # No client-side retries: an outage must cost one timeout, then defaults (see module doc).
        self._client = client or redis.Redis.from_url(
            settings.url,
            socket_timeout=settings.socket_timeout_ms / 1000,
            socket_connect_timeout=settings.connect_timeout_ms / 1000,
            retry=Retry(NoBackoff(), 0),
            **settings.client_kwargs(),
        )
        self._down_until = 0.0
        capacity = settings.cache_max_entries
        ttl = settings.cache_ttl_s
        self._user_cache = _SlotCache(capacity, ttl)
        self._user_dense = np.zeros((self._user_cache.capacity, user_dense_dim), dtype=np.float32)
        self._recent_cap = recent_cap
        self._user_recent = np.zeros((self._user_cache.capacity, recent_cap), dtype=np.int64)
        self._user_recent_len = np.zeros(self._user_cache.capacity, dtype=np.int64)
        self._item_cache = _SlotCache(capacity, ttl)
        self._item_records = np.zeros(self._item_cache.capacity, dtype=self._item_dtype)

    def enrich(
        self, user_ids: npt.NDArray[np.int64], item_ids: npt.NDArray[np.int64]
    ) -> Enrichment:
        """Features for events ``user_ids`` (E) and rows ``item_ids`` (R)."""
        now = time.monotonic()
        users, user_inverse = np.unique(user_ids, return_inverse=True)
        items, item_inverse = np.unique(item_ids, return_inverse=True)
        user_slots = self._user_cache.lookup(users, now)
        item_slots = self._item_cache.lookup(items, now)
        user_todo = np.flatnonzero(user_slots < 0)
        item_todo = np.flatnonzero(item_slots < 0)
        self._metrics.record_cache("user", len(users) - len(user_todo), len(user_todo))
        self._metrics.record_cache("item", len(items) - len(item_todo), len(item_todo))

        # Per unique id: cached values first, then what Redis returns; defaults stay elsewhere.
        user_found = user_slots >= 0
        cached = user_slots[user_found]
        user_dense = np.zeros((len(users), self._user_dim), dtype=np.float32)
        user_dense[user_found] = self._user_dense[cached]
        user_recent = np.zeros((len(users), self._recent_cap), dtype=np.int64)
        user_recent[user_found] = self._user_recent[cached]
        recent_len = np.zeros(len(users), dtype=np.int64)
        recent_len[user_found] = self._user_recent_len[cached]
        item_found = item_slots >= 0
        items_out = np.zeros(len(items), dtype=self._item_dtype)
        items_out[item_found] = self._item_records[item_slots[item_found]]

        user_values, item_values = self._fetch(users[user_todo].tolist(), items[item_todo].tolist())
        fetched_users = self._decode_users(
            user_todo, user_values, user_dense, user_recent, recent_len
        )
        user_found[fetched_users] = True
        fetched_items = self._decode_items(item_todo, item_values, items_out)
        item_found[fetched_items] = True
        self._remember_users(
            users[fetched_users], fetched_users, user_dense, user_recent, recent_len, now
        )
        self._remember_items(items[fetched_items], items_out[fetched_items], now)

        event_recent_len = recent_len[user_inverse]
        kept = np.arange(self._recent_cap)[None, :] < event_recent_len[:, None]
        return Enrichment(
            user_dense=user_dense[user_inverse],
            user_recent_counts=event_recent_len,
            user_recent_ids=user_recent[user_inverse][kept],
            user_missing=~user_found[user_inverse],
            item_category=items_out["category"][item_inverse],
            item_dense=items_out["dense"][item_inverse],
            item_missing=~item_found[item_inverse],
        )

    def _fetch(
        self, user_ids: list[int], item_ids: list[int]
    ) -> tuple[list[bytes | None], list[bytes | None]]:
        """One MGET for all uncached keys; all-None during an outage."""
        nothing: tuple[list[bytes | None], list[bytes | None]] = (
            [None] * len(user_ids),
            [None] * len(item_ids),
        )
        if not user_ids and not item_ids:
            return nothing
        if time.monotonic() < self._down_until:
            return nothing
        keys = [user_key(self._prefix, u) for u in user_ids]
        keys += [item_key(self._prefix, i) for i in item_ids]
        try:
            values = cast(list[bytes | None], self._client.mget(keys))
        except redis.RedisError as exc:
            self._down_until = time.monotonic() + self._settings.retry_after_s
            log.warning(
                "redis unavailable (%s); serving default features for %.1fs",
                exc,
                self._settings.retry_after_s,
            )
            return nothing
        return values[: len(user_ids)], values[len(user_ids) :]

    def _decode_users(
        self,
        todo: npt.NDArray[np.int64],
        values: list[bytes | None],
        dense_out: npt.NDArray[np.float32],
        recent_out: npt.NDArray[np.int64],
        recent_len: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        """Fill rows ``todo`` from Redis values; returns the positions that decoded."""
        dense_bytes = 4 * self._user_dim
        decoded: list[int] = []
        for k, v in zip(todo.tolist(), values, strict=True):
            if v is None:
                continue
            if len(v) < dense_bytes or (len(v) - dense_bytes) % 8:
                log.warning("malformed user features (%d bytes); using defaults", len(v))
                continue
            dense = np.frombuffer(v, FLOAT32, self._user_dim)
            if not np.isfinite(dense).all():
                log.warning("non-finite user features (NaN/inf); using defaults")
                continue
            dense_out[k] = dense
            recent = np.frombuffer(v, INT64, offset=dense_bytes)[: self._recent_cap]
            recent_out[k, : len(recent)] = recent
            recent_len[k] = len(recent)
            decoded.append(k)
        return np.asarray(decoded, dtype=np.int64)

    def _decode_items(
        self,
        todo: npt.NDArray[np.int64],
        values: list[bytes | None],
        out: npt.NDArray[np.void],
    ) -> npt.NDArray[np.int64]:
        """Fill rows ``todo`` from Redis values (one frombuffer); returns those that decoded."""
        size = self._item_dtype.itemsize
        good = [v is not None and len(v) == size for v in values]
        malformed = sum(v is not None for v in values) - sum(good)
        if malformed:
            log.warning("%d malformed item feature values; using defaults", malformed)
        positions = todo[np.asarray(good, dtype=bool)] if good else todo[:0]
        if len(positions):
            records = np.frombuffer(
                b"".join(v for v, ok in zip(values, good, strict=True) if ok and v is not None),
                dtype=self._item_dtype,
            )
            finite = np.isfinite(records["dense"]).reshape(len(records), -1).all(axis=1)
            if not finite.all():
                log.warning(
                    "%d item feature values non-finite (NaN/inf); using defaults",
                    int((~finite).sum()),
                )
                records, positions = records[finite], positions[finite]
            out[positions] = records
        return positions

    def _remember_users(
        self,
        ids: npt.NDArray[np.int64],
        rows: npt.NDArray[np.int64],
        dense: npt.NDArray[np.float32],
        recent: npt.NDArray[np.int64],
        recent_len: npt.NDArray[np.int64],
        now: float,
    ) -> None:
        """Cache the users Redis returned (defaults after misses/outages are never cached)."""
        capacity = self._user_cache.capacity
        ids, rows = ids[-capacity:], rows[-capacity:]
        if len(ids):
            slots = self._user_cache.allocate(ids, now)
            self._user_dense[slots] = dense[rows]
            self._user_recent[slots] = recent[rows]
            self._user_recent_len[slots] = recent_len[rows]

    def _remember_items(
        self, ids: npt.NDArray[np.int64], records: npt.NDArray[np.void], now: float
    ) -> None:
        """Cache the items Redis returned."""
        capacity = self._item_cache.capacity
        ids, records = ids[-capacity:], records[-capacity:]
        if len(ids):
            self._item_records[self._item_cache.allocate(ids, now)] = records
