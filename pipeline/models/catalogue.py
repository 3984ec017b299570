"""The item catalogue (which raw item ids exist), and the retrieval index of a model version.

The model knows table rows, not items: raw ids are hashed into rows, so the rows alone cannot
say which items exist. The catalogue says it (``retrieval.catalogue``):

- ``redis`` (default): every item key of the feature store, ``<prefix>:i:<item_id>``, read
  with SCAN (no blocking KEYS). These are the items the ranker has features for; an item
  without features would be scored with defaults anyway. It is read each time a model
  version is loaded, so items added since the last load join with the next version.
- ``file``: ``retrieval.catalogue_path``, a ``.npy`` int64 array or a text file with one
  decimal id per line (blank lines and ``#`` comments skipped).

:func:`load_retrieval_index` is what a model loader calls next to loading the scorer: the
catalogue, the checkpoint's tables and the Faiss index, built off the scoring path.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import redis

from pipeline.settings.retrieval import CatalogueSource, RetrievalSettings

if TYPE_CHECKING:
    from model.retrieval.index import RetrievalIndex

__all__ = ["catalogue_from_file", "catalogue_from_redis", "load_catalogue", "load_retrieval_index"]

log = logging.getLogger(__name__)

Int64Array = npt.NDArray[np.int64]
_SCAN_COUNT = 10_000
_GLOB_SPECIAL = "*?[]\\"


def catalogue_from_redis(client: redis.Redis, key_prefix: str) -> Int64Array:
    """Raw ids of every item key ``<key_prefix>:i:<id>`` in Redis (SCAN, in pages).

    Args:
        client: the feature store.
        key_prefix: ``redis.key_prefix``.

    Returns:
        int64[N] sorted unique ids; keys whose suffix is not an integer are skipped.

    Example::

        ids = catalogue_from_redis(redis.Redis.from_url(url), "sr")
    """
    escaped = "".join(f"\\{c}" if c in _GLOB_SPECIAL else c for c in key_prefix)
    head = len(key_prefix) + 3  # "<prefix>:i:"
    ids: list[int] = []
    for key in client.scan_iter(match=f"{escaped}:i:*", count=_SCAN_COUNT):
        text = key.decode() if isinstance(key, bytes) else str(key)
        try:
            ids.append(int(text[head:]))
        except ValueError:
            continue
    return np.unique(np.asarray(ids, dtype=np.int64))


def catalogue_from_file(path: Path) -> Int64Array:
    """Raw item ids from a ``.npy`` int64 array or a text file (one id per line).

    Args:
        path: the file.

    Returns:
        int64[N] sorted unique ids.

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: on a line that is not an integer, or a ``.npy`` that is not 1-d integers.
    """
    if path.suffix == ".npy":
        data = np.load(path, allow_pickle=False)
        if data.ndim != 1 or not np.issubdtype(data.dtype, np.integer):
            raise ValueError(f"{path}: expected a 1-d integer array, got {data.dtype}{data.shape}")
        return np.unique(data.astype(np.int64))
    ids: list[int] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            ids.append(int(text))
        except ValueError:
            raise ValueError(f"{path}:{number}: not an item id: {text!r}") from None
    return np.unique(np.asarray(ids, dtype=np.int64))


def load_catalogue(
    settings: RetrievalSettings, client: redis.Redis | None, key_prefix: str
) -> Int64Array:
    """The catalogue ``retrieval.catalogue`` names.

    Args:
        settings: ``[retrieval]``.
        client: the feature store (needed for ``catalogue = "redis"``).
        key_prefix: ``redis.key_prefix``.

    Returns:
        int64[N] sorted unique raw item ids.

    Raises:
        ValueError: for ``redis`` without a client; as the loaders.
    """
    if settings.catalogue is CatalogueSource.FILE:
        assert settings.catalogue_path is not None  # the settings' validator checked it
        return catalogue_from_file(settings.catalogue_path)
    if client is None:
        raise ValueError('retrieval.catalogue = "redis" needs a Redis client')
    return catalogue_from_redis(client, key_prefix)


def load_retrieval_index(
    checkpoint: Path, settings: RetrievalSettings, catalogue: Int64Array
) -> RetrievalIndex:
    """The retrieval index of the model version at ``checkpoint``.

    Reads the tables retrieval needs from the checkpoint files (never from the served model,
    which may be quantized or sharded) and builds the index; call it from the model loader,
    on the watcher's thread, so the index is swapped with its model.

    Args:
        checkpoint: the version's checkpoint directory (plain or DCP).
        settings: ``[retrieval]``.
        catalogue: raw item ids (:func:`load_catalogue`).

    Returns:
        The index; its ``build_seconds`` and ``kind`` are logged.

    Example::

        catalogue = load_catalogue(settings.retrieval, client, settings.redis.key_prefix)
        index = load_retrieval_index(version_dir, settings.retrieval, catalogue)
    """
    from model.retrieval.index import build_index, needed_tables
    from model.store.tables import EmbeddingTables

    config = settings.to_config()
    tables = EmbeddingTables.from_checkpoint(checkpoint, needed_tables(config))
    index = build_index(tables, catalogue, config)
    log.info(
        "retrieval index of %s: %s over %d items, built in %.2fs",
        index.model_version,
        index.kind.value,
        index.num_items,
        index.build_seconds,
    )
    return index
