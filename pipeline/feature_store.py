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
any other producer of features only has to follow this table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import redis

INT64 = np.dtype("<i8")
FLOAT32 = np.dtype("<f4")


def user_key(prefix: str, user_id: int) -> str:
    return f"{prefix}:u:{user_id}"


def item_key(prefix: str, item_id: int) -> str:
    return f"{prefix}:i:{item_id}"


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
