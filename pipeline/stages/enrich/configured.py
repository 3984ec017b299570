"""Enrichment with a configured Redis layout: the user's and the items' records of a batch, one
round trip, into ``Enrichment.user_fields`` / ``item_fields``.

As the built-in enricher (:mod:`pipeline.stages.enrich.enricher`): every event's user and every
row's item is looked up in an in-process TTL cache first (:class:`FeatureCache`: one compiled
pass), and the distinct ids it misses are fetched with ONE send: an ``MGET`` for packed
records, one ``HMGET`` per id for hashes (:mod:`pipeline.connectors.redis.layout`), all in one
buffer, the replies read back in order. Missing or malformed records and fields, and Redis
outages, never lose an event: each absent field is marked absent in the
:class:`~pipeline.types.FieldColumns` (the features stage applies its key's ``missing`` policy,
a dense part its ``default``), the record's other fields serve, and the event's
Recommendation lists the side in ``fallback_features``. Records with a field present are
cached with which fields are (one int64 of bits after the record's ints); records with none
(no key, an outage) never are. After an outage Redis is left alone for
``redis.retry_after_s``. An id list with a ``weights`` field is present only with its weights,
one per id (else both are absent, :mod:`pipeline.connectors.redis.layout`); its weights go
beside its ids (``FieldColumns.list_weights``).

Example::

    enricher = ConfiguredEnricher(settings.redis, fmap, Metrics())
    enrichment = enricher.enrich(user_ids, candidate_ids)
    enrichment.user_fields.floats   # each user's vector fields
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from model.features.mapping import FeatureMap, RecordKind, RecordLayout
from pipeline.connectors.redis.connection import (
    FeatureClient,
    FeatureConnection,
    FeatureStoreUnavailable,
    RecordRefused,
)
from pipeline.connectors.redis.layout import (
    RecordRows,
    hmget_commands,
    keyed_commands,
    mget_head,
    parse_hashes,
    parse_packed,
)
from pipeline.observability.metrics import Metrics
from pipeline.settings.features import RecordFormat
from pipeline.settings.redis import RedisSettings
from pipeline.stages.enrich.cache import CacheLookup, FeatureCache
from pipeline.stages.enrich.enricher import _distinct
from pipeline.types import Enrichment, FieldColumns

__all__ = ["ConfiguredEnricher"]

log = logging.getLogger(__name__)

Int64Array = npt.NDArray[np.int64]


class _Side:
    """One side's layout and cache (users or items)."""

    def __init__(self, name: str, layout: RecordLayout, settings: RedisSettings) -> None:
        self.name = name
        self.layout = layout
        self.max_bytes = settings.max_value_bytes
        self.ids = layout.count(RecordKind.ID)
        self.lists = layout.count(RecordKind.ID_LIST)
        kinds = [f.kind for f in layout.fields]
        self._id_fields = [i for i, k in enumerate(kinds) if k is RecordKind.ID]
        self._list_fields = [i for i, k in enumerate(kinds) if k is RecordKind.ID_LIST]
        self._float_fields = np.zeros(layout.count(RecordKind.VECTOR), dtype=np.int64)
        for i, f in enumerate(layout.fields):  # each float column's field
            if f.kind in (RecordKind.VECTOR, RecordKind.WEIGHTS):
                self._float_fields[f.column : f.column + f.width] = i
        self._pairs = [  # (list index, its weights' field): parsed present together or not
            (f.pairs, i) for i, f in enumerate(layout.fields) if f.kind is RecordKind.WEIGHTS
        ]
        self._bits = np.int64(1) << np.arange(len(kinds), dtype=np.int64)
        self.cache = FeatureCache(
            settings.cache_max_entries,
            settings.cache_ttl_s,
            self.ids + self.lists + 1,  # + which fields are present, one bit each
            layout.count(RecordKind.VECTOR),
            side_width=sum(layout.list_caps),
        )
        # Load (or compile) its kernels now, so that the first batch does not wait for them.
        self.request(np.zeros(1, dtype=np.int64))
        if layout.format is RecordFormat.PACKED:
            self.parse([[None]], 1)

    def request(self, ids: Int64Array) -> tuple[bytes, int]:
        """The commands that read ``ids``' records, and how many replies they bring."""
        if not len(ids):
            return b"", 0
        if self.layout.format is RecordFormat.PACKED:
            return mget_head(len(ids)) + keyed_commands(self.layout.key, ids), 1
        return hmget_commands(self.layout, ids), len(ids)

    def parse(self, replies: list[Any], n: int) -> CacheLookup:
        """The side's replies as cache payloads (``[]``: an outage, every record missing);
        ``missing``: records with no field present."""
        if not replies:
            rows = RecordRows.defaults(n, self.layout)
        elif self.layout.format is RecordFormat.PACKED:
            values = cast(list[bytes | None], replies[0])
            rows = parse_packed(values, self.layout, self.name, self.max_bytes)
        else:
            rows = parse_hashes(replies, self.layout, self.name, self.max_bytes)
        bits = (rows.present * self._bits).sum(axis=1, dtype=np.int64)
        ints = np.concatenate([rows.ints, bits[:, None]], axis=1)
        return CacheLookup(ints, rows.floats, rows.side, ~rows.found, np.zeros(0, np.int64))

    def columns(self, found: CacheLookup) -> tuple[FieldColumns, npt.NDArray[np.bool_]]:
        """A lookup's rows as :class:`FieldColumns` (each list cut to its length, absent
        fields marked), and which records lack a field (for ``fallback_features``)."""
        bits = found.ints[:, -1]
        present = (bits[:, None] & self._bits) != 0
        counts = found.ints[:, self.ids : self.ids + self.lists]
        caps = self.layout.list_caps
        keep = np.zeros(found.side.shape, dtype=bool)
        offset = 0
        for j, cap in enumerate(caps):
            keep[:, offset : offset + cap] = np.arange(cap)[None, :] < counts[:, j : j + 1]
            offset += cap
        floats = np.where(present[:, self._float_fields], found.floats, np.float32(np.nan))
        fields = FieldColumns(
            np.ascontiguousarray(found.ints[:, : self.ids]),
            floats.astype(np.float32, copy=False),
            np.ascontiguousarray(counts),
            found.side[keep],
            present[:, self._id_fields],
            present[:, self._list_fields],
            list_weights=self._weights(found.floats, keep) if self._pairs else None,
        )
        return fields, ~present.all(axis=1)

    def _weights(
        self, floats: npt.NDArray[np.float32], keep: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float32]:
        """Each kept list id's weight (its list's ``weights`` field; 1.0 without one)."""
        out = np.ones(keep.shape, dtype=np.float32)
        starts = np.concatenate(([0], np.cumsum(self.layout.list_caps)))
        for j, weights in self._pairs:
            field = self.layout.fields[weights]
            out[:, starts[j] : starts[j + 1]] = floats[:, field.column : field.column + field.width]
        return out[keep]


class ConfiguredEnricher:
    """Reads the configured user and item records of batches (see the module docstring).

    Args:
        settings: Redis URL, timeouts, cache size and TTL.
        fmap: the feature map (its ``user`` and ``item`` layouts; ``None``: not read).
        metrics: cache hit/miss counters.
        client: an existing Redis client (tests); built from ``settings.url`` otherwise.
    """

    def __init__(
        self,
        settings: RedisSettings,
        fmap: FeatureMap,
        metrics: Metrics,
        client: FeatureClient | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._connection = FeatureConnection(settings, client)  # no client-side retries
        self._down_until = 0.0
        self._users = _Side("user", fmap.user, settings) if fmap.user else None
        self._items = _Side("item", fmap.item, settings) if fmap.item else None
        _distinct(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))  # load its kernel

    def enrich(self, user_ids: Int64Array, item_ids: Int64Array) -> Enrichment:
        """Records of the users of ``user_ids`` (E events) and items of ``item_ids`` (R rows)."""
        now = time.monotonic()
        sides = [(self._users, user_ids), (self._items, item_ids)]
        found = [s.cache.lookup(ids, now) if s else None for s, ids in sides]
        todo: list[tuple[Int64Array, Int64Array]] = []
        for (side, ids), lookup in zip(sides, found, strict=True):
            todo.append(_distinct(ids, lookup.missing_rows) if lookup else (ids[:0], ids[:0]))
            if side and lookup:
                self._metrics.record_cache(side.name, lookup.served, len(todo[-1][0]))
        if any(len(t[0]) for t in todo):
            replies = self._fetch([(s, t[0]) for (s, _), t in zip(sides, todo, strict=True)])
            for (side, _), lookup, (ids, source), got in zip(
                sides, found, todo, replies, strict=True
            ):
                if side is None or lookup is None or not len(ids):
                    continue
                fetched = side.parse(got, len(ids))
                lookup.fill(lookup.missing_rows, source, fetched)
                ok = ~fetched.missing  # records with no field present are never cached
                side.cache.store(
                    ids[ok], fetched.ints[ok], fetched.floats[ok], fetched.side[ok], now
                )
        users, items = (
            _fields(side, lookup, len(ids))
            for (side, ids), lookup in zip(sides, found, strict=True)
        )
        return Enrichment(
            user_dense=np.zeros((len(user_ids), 0), dtype=np.float32),
            user_recent_counts=np.zeros(len(user_ids), dtype=np.int64),
            user_recent_ids=np.zeros(0, dtype=np.int64),
            user_missing=users[1],
            item_category=np.zeros(len(item_ids), dtype=np.int64),
            item_dense=np.zeros((len(item_ids), 0), dtype=np.float32),
            item_missing=items[1],
            user_fields=users[0],
            item_fields=items[0],
        )

    def _fetch(self, wanted: Sequence[tuple[_Side | None, Int64Array]]) -> list[list[Any]]:
        """Every side's replies, from one send; ``[]`` per side during an outage."""
        requests = [s.request(ids) if s else (b"", 0) for s, ids in wanted]
        if time.monotonic() < self._down_until:
            return [[] for _ in wanted]
        try:
            self._connection.send([r for r, _ in requests if r])
            return [[self._reply() for _ in range(count)] for _, count in requests]
        except FeatureStoreUnavailable as exc:
            self._connection.disconnect()  # replies left unread must not answer the next send
            self._down_until = time.monotonic() + self._settings.retry_after_s
            log.warning(
                "redis unavailable (%s); serving default features for %.1fs",
                exc,
                self._settings.retry_after_s,
            )
            return [[] for _ in wanted]

    def _reply(self) -> Any:
        """The next reply; an error reply (e.g. ``WRONGTYPE``: a key of another type) is that
        record's alone: ``None``, read whole, so the replies after it stay in step."""
        try:
            return self._connection.read()
        except RecordRefused as exc:
            log.warning("redis refused one record's read (%s); served as missing", exc)
            return None


def _fields(
    side: _Side | None, lookup: CacheLookup | None, n: int
) -> tuple[FieldColumns | None, npt.NDArray[np.bool_]]:
    """A side's fields and which records lack one (no layout: no fields, nothing missing)."""
    if side is None or lookup is None:
        return None, np.zeros(n, dtype=bool)
    return side.columns(lookup)
