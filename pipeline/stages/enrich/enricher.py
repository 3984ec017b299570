"""Enrichment: user and item features for a whole batch, in one Redis round trip.

For each batch the enricher looks every event's user and every row's item up in an
in-process TTL cache (:mod:`pipeline.stages.enrich.cache`: one compiled pass each, no Python object
per id), and fetches the distinct ids it misses with ONE ``MGET`` (never a GET per event),
written by one compiled pass (:func:`pipeline.connectors.redis.feature_store.mget_request`) and
sent on a connection of the enricher's own (redis-py's, so TLS, authentication and reconnection are
its; the generic command path costs about 0.1 ms per call and a Python string per key).
Missing keys, malformed values and Redis outages never lose an event: the features fall back
to defaults (zeros, no recent items, category 0) and the event's Recommendation lists the
feature group in ``fallback_features``. After an outage Redis is left alone for
``retry_after_s`` so a dead server does not add its timeout to every batch. A value longer than
``redis.max_value_bytes`` is treated as missing (defaults, flagged, logged) and never copied
into the decode buffer; the client still reads each reply whole, so the largest value stored
bounds what one read holds in memory.
"""

from __future__ import annotations

import logging
import time
from itertools import compress
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

from model.features.segments import group_values
from model.kernels import kernel
from pipeline.connectors.redis.connection import (
    FeatureClient,
    FeatureConnection,
    FeatureStoreUnavailable,
)
from pipeline.connectors.redis.feature_store import (
    item_record_dtype,
    mget_request,
)
from pipeline.observability.metrics import Metrics
from pipeline.settings.redis import RedisSettings
from pipeline.stages.enrich.cache import CacheLookup, FeatureCache
from pipeline.types import Enrichment

log = logging.getLogger(__name__)


class BatchEnricher(Protocol):
    """What the loop needs of an enricher (:class:`FeatureEnricher`, or a fake in tests)."""

    def enrich(
        self, user_ids: npt.NDArray[np.int64], item_ids: npt.NDArray[np.int64]
    ) -> Enrichment: ...


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
        client: FeatureClient | None = None,
    ) -> None:
        self._settings = settings
        self._prefix = settings.key_prefix
        self._user_dim = user_dense_dim
        self._item_dim = item_dense_dim
        self._item_dtype = item_record_dtype(item_dense_dim)
        self._recent_cap = recent_cap
        self._metrics = metrics
        self._connection = FeatureConnection(settings, client)  # no client-side retries
        """The enricher's own connection: opened by the first MGET, closed by an error, opened
        again by the next MGET."""
        self._down_until = 0.0
        capacity, ttl = settings.cache_max_entries, settings.cache_ttl_s
        # Users: the recent list's length in the row, the list itself in the side array (too
        # wide for a cache line). Items: category and dense vector, all in the row. Building
        # the caches loads (or compiles) their kernels, so the first batch does not wait.
        self._users = FeatureCache(capacity, ttl, 1, user_dense_dim, side_width=recent_cap)
        self._items = FeatureCache(capacity, ttl, 1, item_dense_dim)
        for fetched in (self._decode_users([]), self._decode_items([])):  # load the kernels now
            fetched.fill(fetched.missing_rows, fetched.missing_rows, fetched)
        mget_request(self._prefix, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))
        _distinct(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))

    def enrich(
        self, user_ids: npt.NDArray[np.int64], item_ids: npt.NDArray[np.int64]
    ) -> Enrichment:
        """Features for events ``user_ids`` (E) and rows ``item_ids`` (R)."""
        now = time.monotonic()
        users = self._users.lookup(user_ids, now)
        items = self._items.lookup(item_ids, now)
        user_todo, user_source = _distinct(user_ids, users.missing_rows)
        item_todo, item_source = _distinct(item_ids, items.missing_rows)
        self._metrics.record_cache("user", users.served, len(user_todo))
        self._metrics.record_cache("item", items.served, len(item_todo))
        if len(user_todo) or len(item_todo):
            user_values, item_values = self._fetch(user_todo, item_todo)
            if len(user_todo):  # (a kind with nothing fetched has nothing to decode or store)
                fetched = self._decode_users(user_values)
                _take_fetched(self._users, user_todo, users, user_source, fetched, now)
            if len(item_todo):
                fetched = self._decode_items(item_values)
                _take_fetched(self._items, item_todo, items, item_source, fetched, now)

        recent_len = users.ints.reshape(-1)
        kept = np.arange(self._recent_cap)[None, :] < recent_len[:, None]
        return Enrichment(
            user_dense=users.floats,
            user_recent_counts=recent_len,
            user_recent_ids=users.side[kept],
            user_missing=users.missing,
            item_category=items.ints.reshape(-1),
            item_dense=items.floats,
            item_missing=items.missing,
        )

    def _fetch(
        self, user_ids: npt.NDArray[np.int64], item_ids: npt.NDArray[np.int64]
    ) -> tuple[list[bytes | None], list[bytes | None]]:
        """One MGET for all uncached keys; all-None during an outage."""
        nothing: tuple[list[bytes | None], list[bytes | None]] = (
            [None] * len(user_ids),
            [None] * len(item_ids),
        )
        if not len(user_ids) and not len(item_ids):
            return nothing
        if time.monotonic() < self._down_until:
            return nothing
        request = mget_request(self._prefix, user_ids, item_ids)
        try:
            # A failed send or read closes the connection; the next send opens a new one.
            self._connection.send([request])
            values = cast(list[bytes | None], self._connection.read())
        except FeatureStoreUnavailable as exc:
            self._down_until = time.monotonic() + self._settings.retry_after_s
            log.warning(
                "redis unavailable (%s); serving default features for %.1fs",
                exc,
                self._settings.retry_after_s,
            )
            return nothing
        return values[: len(user_ids)], values[len(user_ids) :]

    def _decode_users(self, values: list[bytes | None]) -> CacheLookup:
        """User values from Redis: ``float32[dim]`` then ``int64[k]`` recent items (kept up to
        the cap); ``missing`` where absent, malformed or non-finite. One compiled pass."""
        dim, cap = self._user_dim, self._recent_cap
        lengths = _lengths(values, self._settings.max_value_bytes, "user")
        good = (lengths >= 4 * dim) & ((lengths - 4 * dim) % 8 == 0)
        _warn_malformed("user", lengths, good)
        out = CacheLookup.defaults(len(values), 1, dim, cap)
        words = _joined_words(values, good)  # every good value is a whole number of words
        bad = _parse_users(
            words, words.view(np.float32), lengths, good,
            out.ints, out.floats, out.side, out.missing,
        )  # fmt: skip
        if bad:
            log.warning("%d user feature values non-finite (NaN/inf); using defaults", bad)
        return out

    def _decode_items(self, values: list[bytes | None]) -> CacheLookup:
        """Item values from Redis: ``int64`` category then ``float32[dim]``; ``missing`` where
        absent, malformed or non-finite. One compiled pass."""
        lengths = _lengths(values, self._settings.max_value_bytes, "item")
        good = lengths == self._item_dtype.itemsize
        _warn_malformed("item", lengths, good)
        out = CacheLookup.defaults(len(values), 1, self._item_dim, 0)
        words = _joined_words(values, good)  # a good value is a whole number of words
        bad = _parse_items(words, words.view(np.float32), good, out.ints, out.floats, out.missing)
        if bad:
            log.warning("%d item feature values non-finite (NaN/inf); using defaults", bad)
        return out


def _take_fetched(
    cache: FeatureCache,
    todo: npt.NDArray[np.int64],
    found: CacheLookup,
    source: npt.NDArray[np.int64],
    fetched: CacheLookup,
    now: float,
) -> None:
    """The rows ``found`` missed take what Redis returned for their ids (``todo``, row
    ``source[k]`` of ``fetched`` for missed row ``k``); what Redis returned is cached. Defaults
    after misses, malformed values and outages are never cached."""
    found.fill(found.missing_rows, source, fetched)
    ok = ~fetched.missing
    cache.store(todo[ok], fetched.ints[ok], fetched.floats[ok], fetched.side[ok], now)


def _distinct(
    ids: npt.NDArray[np.int64], rows: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The distinct ids of ``rows`` (sorted), and for each row its position among them."""
    if not len(rows):
        return rows, rows
    todo, _, _, source = group_values(np.ascontiguousarray(ids[rows], dtype=np.int64))
    return todo, source


def _lengths(values: list[bytes | None], max_bytes: int, kind: str) -> npt.NDArray[np.int64]:
    """Byte length of every value; -1 for None and for a value over ``max_bytes`` (logged),
    which is then treated as missing."""
    if None in values:
        lengths = np.fromiter((-1 if v is None else len(v) for v in values), np.int64, len(values))
    else:  # the usual case: every key stored (C's len over the list, no Python frame per value)
        lengths = np.fromiter(map(len, cast(list[bytes], values)), np.int64, len(values))
    too_large = lengths > max_bytes
    if too_large.any():
        log.warning(
            "%d %s feature values over redis.max_value_bytes=%d (largest %d bytes); using defaults",
            int(too_large.sum()),
            kind,
            max_bytes,
            int(lengths.max()),
        )
        lengths[too_large] = -1
    return lengths


def _joined_words(
    values: list[bytes | None], good: npt.NDArray[np.bool_]
) -> npt.NDArray[np.uint32]:
    """The ``good`` values laid end to end, as 32-bit little-endian words."""
    joined = b"".join(cast(list[bytes], list(compress(values, good))))
    return np.frombuffer(joined, dtype="<u4")


def _warn_malformed(kind: str, lengths: npt.NDArray[np.int64], good: npt.NDArray[np.bool_]) -> None:
    bad = int((lengths >= 0).sum()) - int(good.sum())
    if bad:
        log.warning("%d malformed %s feature values; using defaults", bad, kind)


@kernel
def _int64_at(words: npt.NDArray[np.uint32], w: int) -> int:
    """The little-endian int64 in ``words[w], words[w + 1]``."""
    return int(np.int64(np.uint64(words[w]) | (np.uint64(words[w + 1]) << np.uint64(32))))


@kernel(inline="always")  # measured: a call costs ~20 %
def _take_finite(
    floats: npt.NDArray[np.float32], start: int, dense: npt.NDArray[np.float32], row: int
) -> bool:
    """Copy ``floats[start:start + dim]`` into ``dense[row]`` when every one is finite;
    whether it did (a value with a NaN or an infinity is left to the defaults)."""
    dim = dense.shape[1]
    for j in range(dim):
        if not np.isfinite(floats[start + j]):
            return False
    for j in range(dim):
        dense[row, j] = floats[start + j]
    return True


@kernel
def _parse_users(
    words: npt.NDArray[np.uint32],
    floats: npt.NDArray[np.float32],
    lengths: npt.NDArray[np.int64],
    good: npt.NDArray[np.bool_],
    recent_len: npt.NDArray[np.int64],
    dense: npt.NDArray[np.float32],
    recent: npt.NDArray[np.int64],
    missing: npt.NDArray[np.bool_],
) -> int:
    """Fill row ``i`` from value ``i`` where ``good`` (values laid end to end in ``words``);
    returns how many good values were not finite (left missing)."""
    dim, cap = dense.shape[1], recent.shape[1]
    w = 0
    bad = 0
    for i in range(len(good)):
        if not good[i]:
            continue
        start, size = w, lengths[i] // 4
        w += size
        if not _take_finite(floats, start, dense, i):
            bad += 1
            continue
        missing[i] = False
        count = min((size - dim) // 2, cap)
        recent_len[i, 0] = count
        for k in range(count):
            recent[i, k] = _int64_at(words, start + dim + 2 * k)
    return bad


@kernel
def _parse_items(
    words: npt.NDArray[np.uint32],
    floats: npt.NDArray[np.float32],
    good: npt.NDArray[np.bool_],
    category: npt.NDArray[np.int64],
    dense: npt.NDArray[np.float32],
    missing: npt.NDArray[np.bool_],
) -> int:
    """Fill row ``i`` from value ``i`` where ``good`` (fixed-size values laid end to end);
    returns how many good values were not finite (left missing)."""
    dim = dense.shape[1]
    w = 0
    bad = 0
    for i in range(len(good)):
        if not good[i]:
            continue
        start = w
        w += 2 + dim
        if not _take_finite(floats, start + 2, dense, i):
            bad += 1
            continue
        missing[i] = False
        category[i, 0] = _int64_at(words, start)
    return bad
