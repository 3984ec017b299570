"""Redis key layout of the feature store, and the writer that fills it.

Keys (``<prefix>`` is ``redis.key_prefix``, default ``sr``; ids are decimal):

=========================  =================================================================
key                        value (little-endian binary, fixed layout)
=========================  =================================================================
``<prefix>:u:<user_id>``   ``float32[user_dense_dim]`` dense vector, then ``int64[n]`` recent
                           item ids, newest first (``n`` >= 0, implied by the length)
``<prefix>:i:<item_id>``   ``int64`` category id, then ``float32[item_dense_dim]`` dense stats
=========================  =================================================================

Binary values keep a batch's MGET small and let the reader decode all items of a batch with one
``numpy.frombuffer``. ``streamrank seed-features`` writes them (synthetic, or from CSV/Parquet);
any other producer of features only has to follow this table. The enricher asks for a batch's
keys with :func:`mget_request`: the same names, written by one compiled pass over the id arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from model.kernels import kernel
from pipeline.settings.redis import RedisSettings

INT64 = np.dtype("<i8")
FLOAT32 = np.dtype("<f4")


def enrichment_client(settings: RedisSettings) -> redis.Redis:
    """The enrichers' client: the settings' timeouts and TLS/auth, and no client-side retries
    (an outage must cost one timeout, then defaults: see :mod:`pipeline.stages.enrich`)."""
    return redis.Redis.from_url(
        settings.url,
        socket_timeout=settings.socket_timeout_ms / 1000,
        socket_connect_timeout=settings.connect_timeout_ms / 1000,
        retry=Retry(NoBackoff(), 0),
        **settings.client_kwargs(),
    )


def user_key(prefix: str, user_id: int) -> str:
    return f"{prefix}:u:{user_id}"


def item_key(prefix: str, item_id: int) -> str:
    return f"{prefix}:i:{item_id}"


_MAX_DIGITS = 19
"""Decimal digits of the largest int64 magnitude."""


def mget_request(
    prefix: str, user_ids: npt.NDArray[np.int64], item_ids: npt.NDArray[np.int64]
) -> bytes:
    """The Redis ``MGET`` of every user key then every item key, in RESP (one compiled pass,
    no Python string per key): what ``redis.Redis.mget`` would send for
    ``[user_key(prefix, u) for u in user_ids] + [item_key(prefix, i) for i in item_ids]``.

    Example::

        connection.send_packed_command([mget_request("sr", users, items)])
        values = connection.read_response()
    """
    users = np.frombuffer(f"{prefix}:u:".encode(), dtype=np.uint8)
    items = np.frombuffer(f"{prefix}:i:".encode(), dtype=np.uint8)
    n = len(user_ids) + len(item_ids)
    head = b"*%d\r\n$4\r\nMGET\r\n" % (n + 1)
    longest = max(len(users), len(items)) + _MAX_DIGITS + 1  # a key, its sign included
    out = np.empty(len(head) + n * (len(str(longest)) + longest + 5), dtype=np.uint8)
    out[: len(head)] = np.frombuffer(head, dtype=np.uint8)
    end = _put_keys(users, np.ascontiguousarray(user_ids, dtype=np.int64), out, len(head))
    end = _put_keys(items, np.ascontiguousarray(item_ids, dtype=np.int64), out, end)
    return out[:end].tobytes()


@kernel
def _put_keys(
    prefix: npt.NDArray[np.uint8], ids: npt.NDArray[np.int64], out: npt.NDArray[np.uint8], at: int
) -> int:
    """Write ``$<length>\\r\\n<prefix><id>\\r\\n`` for every id from ``out[at]``; returns
    the end."""
    none = out[:0]
    for v in ids:
        at = put_bulk_key(prefix, v, none, out, at)
    return at


@kernel
def put_bulk_key(
    prefix: npt.NDArray[np.uint8],
    v: np.int64,
    suffix: npt.NDArray[np.uint8],
    out: npt.NDArray[np.uint8],
    at: int,
) -> int:
    """Write one RESP bulk string ``$<length>\\r\\n<prefix><id><suffix>\\r\\n`` (the id in
    decimal) from ``out[at]``; returns the end."""
    negative = v < 0
    magnitude = np.uint64(-(v + 1)) + np.uint64(1) if negative else np.uint64(v)
    digits = _decimal_digits(magnitude)
    length = np.uint64(len(prefix) + len(suffix) + digits + (1 if negative else 0))
    out[at] = 36  # '$'
    at += 1
    at = _put_decimal(length, _decimal_digits(length), out, at)
    out[at], out[at + 1] = 13, 10
    at += 2
    out[at : at + len(prefix)] = prefix
    at += len(prefix)
    if negative:
        out[at] = 45  # '-'
        at += 1
    at = _put_decimal(magnitude, digits, out, at)
    out[at : at + len(suffix)] = suffix
    at += len(suffix)
    out[at], out[at + 1] = 13, 10
    return at + 2


@kernel
def _decimal_digits(value: np.uint64) -> int:
    digits = 1
    rest = value // np.uint64(10)
    while rest > 0:
        digits += 1
        rest //= np.uint64(10)
    return digits


@kernel
def _put_decimal(value: np.uint64, digits: int, out: npt.NDArray[np.uint8], at: int) -> int:
    """Write ``value`` (``digits`` decimal digits) in decimal from ``out[at]``; returns the end."""
    for j in range(digits):
        out[at + digits - 1 - j] = 48 + np.uint8(value % np.uint64(10))
        value //= np.uint64(10)
    return at + digits


def item_record_dtype(item_dense_dim: int) -> np.dtype:
    """numpy dtype of one item value: category then dense stats."""
    return np.dtype([("category", INT64), ("dense", FLOAT32, (item_dense_dim,))])


def encode_user(
    dense: npt.NDArray[np.float32], recent: Sequence[int] | npt.NDArray[np.int64]
) -> bytes:
    return np.asarray(dense, FLOAT32).tobytes() + np.asarray(recent, INT64).tobytes()


def encode_items(categories: npt.NDArray[np.int64], dense: npt.NDArray[np.float32]) -> list[bytes]:
    """Values for many items at once (one ``bytes`` per item)."""
    n, dim = dense.shape
    records = np.empty(n, dtype=item_record_dtype(dim))
    records["category"] = categories
    records["dense"] = dense
    size = records.dtype.itemsize
    raw = records.tobytes()
    return [raw[i * size : (i + 1) * size] for i in range(n)]


class FeatureStoreWriter:
    """Writes user and item features in pipelined chunks.

    Example::

        writer = FeatureStoreWriter(redis.Redis.from_url(url), prefix="sr")
        writer.write_items(item_ids, categories, item_dense)
    """

    def __init__(self, client: redis.Redis, prefix: str, chunk: int = 5000) -> None:
        self._client = client
        self._prefix = prefix
        self._chunk = chunk

    def write_users(
        self,
        user_ids: npt.NDArray[np.int64],
        dense: npt.NDArray[np.float32],
        recent: Sequence[Sequence[int] | npt.NDArray[np.int64]],
    ) -> int:
        values = {
            user_key(self._prefix, int(u)): encode_user(d, r)
            for u, d, r in zip(user_ids.tolist(), dense, recent, strict=True)
        }
        return self._mset(values)

    def write_items(
        self,
        item_ids: npt.NDArray[np.int64],
        categories: npt.NDArray[np.int64],
        dense: npt.NDArray[np.float32],
    ) -> int:
        encoded = encode_items(categories, dense)
        values = {
            item_key(self._prefix, i): v for i, v in zip(item_ids.tolist(), encoded, strict=True)
        }
        return self._mset(values)

    def _mset(self, values: dict[str, bytes]) -> int:
        items = list(values.items())
        for start in range(0, len(items), self._chunk):
            self._client.mset(dict(items[start : start + self._chunk]))
        return len(items)
