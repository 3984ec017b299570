"""Enrichment: user and item features for a whole batch, in one Redis round trip.

For each batch the enricher takes the unique user and item ids, serves what it can from an
in-process TTL cache, and fetches the rest with ONE ``MGET`` (never a GET per event). Missing
keys, malformed values and Redis outages never lose an event: the features fall back to
defaults (zeros, no recent items, category 0) and the event's Recommendation lists the feature
group in ``fallback_features``. After an outage Redis is left alone for ``retry_after_s`` so a
dead server does not add its timeout to every batch.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from pipeline.config import RedisSettings
from pipeline.feature_store import FLOAT32, INT64, item_key, item_record_dtype, user_key
from pipeline.metrics import Metrics
from pipeline.stages.slot_table import SlotTable

log = logging.getLogger(__name__)


class FallbackFeature(enum.StrEnum):
    """Feature groups that can fall back to defaults (``Recommendation.fallback_features``)."""

    USER = "user_features"
    ITEM = "item_features"


@dataclass
class Enrichment:
    """Features of one batch, aligned with its events (E) and rows (R).

    Attributes:
        user_dense: float32[E, user_dense_dim].
        user_recent: per event, the stored recent item ids (int64 arrays, newest first).
        user_missing: bool[E], True where user features fell back to defaults.
        item_category: int64[R] raw category ids.
        item_dense: float32[R, item_dense_dim].
        item_missing: bool[R], True where item features fell back to defaults.
    """

    user_dense: npt.NDArray[np.float32]
    user_recent: list[npt.NDArray[np.int64]]
    user_missing: npt.NDArray[np.bool_]
    item_category: npt.NDArray[np.int64]
    item_dense: npt.NDArray[np.float32]
    item_missing: npt.NDArray[np.bool_]


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
        metrics: cache hit/miss and fallback counters.
        client: an existing Redis client (tests); built from ``settings.url`` otherwise.

    Example::

        enricher = FeatureEnricher(settings.redis, 8, 8, Metrics())
        enrichment = enricher.enrich(user_ids, candidate_ids)
    """

    def __init__(
        self,
        settings: RedisSettings,
        user_dense_dim: int,
        item_dense_dim: int,
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
        self._user_recent: list[npt.NDArray[np.int64]] = [
            np.empty(0, np.int64)
        ] * self._user_cache.capacity
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
        user_dense = np.zeros((len(users), self._user_dim), dtype=np.float32)
        user_dense[user_found] = self._user_dense[user_slots[user_found]]
        empty = np.empty(0, np.int64)
        user_recent = [self._user_recent[s] if s >= 0 else empty for s in user_slots.tolist()]
        item_found = item_slots >= 0
        items_out = np.zeros(len(items), dtype=self._item_dtype)
        items_out[item_found] = self._item_records[item_slots[item_found]]

        user_values, item_values = self._fetch(users[user_todo].tolist(), items[item_todo].tolist())
        fetched_users = self._decode_users(user_todo, user_values, user_dense, user_recent)
        user_found[fetched_users] = True
        fetched_items = self._decode_items(item_todo, item_values, items_out)
        item_found[fetched_items] = True
        self._remember(
            users, items, fetched_users, fetched_items, user_dense, user_recent, items_out, now
        )

        return Enrichment(
            user_dense=user_dense[user_inverse],
            user_recent=[user_recent[i] for i in user_inverse.tolist()],
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
        recent_out: list[npt.NDArray[np.int64]],
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
            recent_out[k] = np.frombuffer(v, INT64, offset=dense_bytes)
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

    def _remember(
        self,
        users: npt.NDArray[np.int64],
        items: npt.NDArray[np.int64],
        fetched_users: npt.NDArray[np.int64],
        fetched_items: npt.NDArray[np.int64],
        user_dense: npt.NDArray[np.float32],
        user_recent: list[npt.NDArray[np.int64]],
        items_out: npt.NDArray[np.void],
        now: float,
    ) -> None:
        """Cache what Redis returned (defaults after misses/outages are never cached)."""
        if len(fetched_users):
            keep = fetched_users[-self._user_cache.capacity :]
            slots = self._user_cache.allocate(users[keep], now)
            self._user_dense[slots] = user_dense[keep]
            for slot, k in zip(slots.tolist(), keep.tolist(), strict=True):
                self._user_recent[slot] = user_recent[k]
        if len(fetched_items):
            keep = fetched_items[-self._item_cache.capacity :]
            slots = self._item_cache.allocate(items[keep], now)
            self._item_records[slots] = items_out[keep]
