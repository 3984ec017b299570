"""The item catalogue (which raw item ids exist), and the retrieval index of a model version.

The model knows table rows, not items: raw ids are hashed into rows, so the rows alone cannot
say which items exist. The catalogue says it (``retrieval.catalogue``):

- ``redis`` (default): every item key of the feature store, ``<prefix>:i:<item_id>``, read
  with SCAN (no blocking KEYS: :func:`pipeline.connectors.redis.keys.key_ids`). These are the
  items the ranker has features for; an item without features would be scored with defaults
  anyway. It is read each time a model version is loaded, so items added since the last load
  join with the next version.
- ``file``: ``retrieval.catalogue_path``, a ``.npy`` int64 array or a text file with one
  decimal id per line (blank lines and ``#`` comments skipped).

A configured model (``[model.module]``) lists the keys of its ``[features.item].key`` template
instead with ``redis``, and may take ``table``: the rows of its index table, when the candidate
key looks it up with ``transform = "identity"`` (the rows are then the ids;
:func:`configured_catalogue`).

:func:`load_retrieval_index` is what a model loader calls next to loading the scorer: the
catalogue, the checkpoint's tables and the Faiss index, built off the scoring path.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from pipeline.connectors.redis.connection import FeatureClient
from pipeline.connectors.redis.keys import key_ids
from pipeline.settings.retrieval import CatalogueSource, RetrievalSettings

if TYPE_CHECKING:
    from model.retrieval.config import RetrievalConfig
    from model.retrieval.index import RetrievalIndex
    from model.retrieval.sources import RetrievalPlan

__all__ = [
    "catalogue_from_file",
    "catalogue_from_redis",
    "configured_catalogue",
    "load_catalogue",
    "load_retrieval_index",
]

log = logging.getLogger(__name__)

Int64Array = npt.NDArray[np.int64]


def catalogue_from_redis(client: FeatureClient, key_prefix: str) -> Int64Array:
    """Raw ids of every item key ``<key_prefix>:i:<id>`` in Redis (SCAN, in pages).

    Args:
        client: the feature store.
        key_prefix: ``redis.key_prefix``.

    Returns:
        int64[N] sorted unique ids; keys whose suffix is not an integer are skipped.

    Example::

        ids = catalogue_from_redis(bulk_client(settings.redis), "sr")
    """
    return key_ids(client, f"{key_prefix}:i:{{id}}")


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
    settings: RetrievalSettings, client: FeatureClient | None, key_prefix: str
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
    if settings.catalogue is CatalogueSource.TABLE:
        raise ValueError(
            'retrieval.catalogue = "table" is for a configured model ([model.module]): the '
            "built-in model hashes item ids into its rows"
        )
    if client is None:
        raise ValueError('retrieval.catalogue = "redis" needs a Redis client')
    return catalogue_from_redis(client, key_prefix)


def configured_catalogue(
    settings: RetrievalSettings, plan: RetrievalPlan, client: FeatureClient | None
) -> Int64Array:
    """The catalogue of a configured model: the ids ``retrieval.catalogue`` names, less those
    outside ``[0, plan.item_id_limit)`` (ids an event could not bring; a warning counts them).

    Args:
        settings: ``[retrieval]``.
        plan: the resolved retrieval (:func:`pipeline.models.retrieval.resolve_retrieval`).
        client: the feature store (needed for ``catalogue = "redis"``).

    Returns:
        int64[N] sorted unique raw item ids.

    Raises:
        ValueError: for ``redis`` without a client; as the loaders.

    Example::

        ids = configured_catalogue(settings.retrieval, plan, client)
    """
    if settings.catalogue is CatalogueSource.TABLE:
        ids = np.arange(plan.catalogue_rows, dtype=np.int64)
    elif settings.catalogue is CatalogueSource.FILE:
        assert settings.catalogue_path is not None  # the settings' validator checked it
        ids = catalogue_from_file(settings.catalogue_path)
    elif client is None:
        raise ValueError('retrieval.catalogue = "redis" needs a Redis client')
    else:
        ids = key_ids(client, plan.catalogue_key)
    kept = (ids >= 0) & (ids < plan.item_id_limit)
    if not kept.all():
        log.warning(
            "retrieval: %d catalogue ids outside [0, %d) left out (an event could not bring "
            "them: codec.max_id, or an identity candidate key with out_of_range = 'dlq')",
            int((~kept).sum()),
            plan.item_id_limit,
        )
    return ids[kept]


def load_retrieval_index(
    checkpoint: Path, config: RetrievalConfig, catalogue: Int64Array
) -> RetrievalIndex:
    """The retrieval index of the model version at ``checkpoint``.

    Reads the tables retrieval needs from the checkpoint files (never from the served model,
    which may be quantized or sharded) and builds the index; call it from the model loader,
    on the watcher's thread, so the index is swapped with its model.

    Args:
        checkpoint: the version's checkpoint directory (plain or DCP).
        config: ``[retrieval]``'s index config (``settings.retrieval.config``, as the model
            loader read it).
        catalogue: raw item ids (:func:`load_catalogue`).

    Returns:
        The index; its ``build_seconds`` and ``kind`` are logged.

    Example::

        catalogue = load_catalogue(settings.retrieval, client, settings.redis.key_prefix)
        index = load_retrieval_index(version_dir, settings.retrieval.config, catalogue)
    """
    from model.retrieval.index import build_index, needed_tables
    from model.store.tables import EmbeddingTables

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
