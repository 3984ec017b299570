"""Listing the ids of one key template's keys in Redis (SCAN, in pages, never the blocking
``KEYS``): the retrieval catalogue of the items that exist (:mod:`pipeline.models.catalogue`).

Example::

    ids = key_ids(client, "shop:offer:{id}")
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import redis

__all__ = ["key_ids"]

_SCAN_COUNT = 10_000
_GLOB_SPECIAL = "*?[]\\"


def key_ids(client: redis.Redis, template: str) -> npt.NDArray[np.int64]:
    """Raw ids of every key of ``template`` (``{id}``: the id in decimal) in Redis (SCAN).

    Args:
        client: the feature store.
        template: a key template, e.g. ``[features.item].key`` (``shop:offer:{id}``).

    Returns:
        int64[N] sorted unique ids; keys whose ``{id}`` part is not an integer are skipped.

    Example::

        ids = key_ids(client, "shop:offer:{id}")
    """
    prefix, _, suffix = template.partition("{id}")
    match = _glob_escaped(prefix) + "*" + _glob_escaped(suffix)
    head, tail = len(prefix), len(suffix)
    ids: list[int] = []
    for key in client.scan_iter(match=match, count=_SCAN_COUNT):
        text = key.decode() if isinstance(key, bytes) else str(key)
        try:
            ids.append(int(text[head : len(text) - tail]))
        except ValueError:
            continue
    return np.unique(np.asarray(ids, dtype=np.int64))


def _glob_escaped(text: str) -> str:
    """``text`` as a literal in a SCAN ``MATCH`` pattern."""
    return "".join(f"\\{c}" if c in _GLOB_SPECIAL else c for c in text)
