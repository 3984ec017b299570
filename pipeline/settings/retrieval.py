"""The ``[retrieval]`` and ``[model_swap]`` sections: candidates for events that bring none, and
how a running pipeline follows a versions directory.

``[retrieval]``: an event whose ``candidate_item_ids`` is empty gets the ``num_candidates``
catalogue items whose ranker item embeddings have the largest inner product with its query
vector (:mod:`model.retrieval.index`); the ranker then scores them. The index is built whenever a
model version is loaded, from that version's tables and the item catalogue read at that time.
With ``[model.module]`` (a configured model), ``query`` and ``items`` name which vectors query
and which are indexed (:mod:`model.retrieval.sources`).

``[model_swap]``: with ``model.checkpoint`` pointing at a versions directory
(:mod:`model.store.versions`), the pipeline polls its pointer and swaps a newly promoted version in
between two batches (:mod:`pipeline.models.watch`).
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import field_validator, model_validator

from model.retrieval.config import RetrievalConfig
from model.retrieval.sources import VectorSource
from pipeline.settings.section import ConfigSection, Section, keys_of

__all__ = [
    "CatalogueSource",
    "ModelSwapSettings",
    "RetrievalSettings",
    "VectorSettings",
    "VectorSource",
]


class CatalogueSource(enum.StrEnum):
    """``retrieval.catalogue``: where the raw ids of the items that exist come from."""

    REDIS = "redis"
    """Every item key of the feature store (``<redis.key_prefix>:i:<item_id>``, a SCAN): the
    items ``seed-features`` (or your feature pipeline) wrote, i.e. the items the ranker has
    features for."""
    FILE = "file"
    """``retrieval.catalogue_path``: a ``.npy`` int64 array, or text with one id per line."""
    TABLE = "table"
    """A configured model whose index is a table (``items.source = "table"``) looked up by the
    candidate id with ``transform = "identity"``: its rows are the item ids ``0..rows-1``."""


class VectorSettings(Section):
    """``retrieval.query`` / ``retrieval.items``: where one side's vectors come from (a
    configured model).

    Example::

        [retrieval]
        query = { source = "table", table = "t_viewer" }   # the user's row of t_viewer
        items = { source = "item", field = "embedding" }   # each item's Redis vector
    """

    source: VectorSource
    """``table`` (one of ``[[model.module.tables]]``), ``user`` (a field of the user's Redis
    record: the query only) or ``item`` (a field of each item's record: the index only)."""
    table: str = ""
    """With ``source = "table"``: the table's name. The query is the row the user id looks up
    (through the transform of the table's key whose field is ``events.user_id``); the index
    holds each item's row (through the transform of the table's ``candidate`` key)."""
    field: str = ""
    """With ``source = "user"`` / ``"item"``: a ``vector:N`` field of ``[features.user]`` /
    ``[features.item]``."""

    @model_validator(mode="after")
    def _valid(self) -> VectorSettings:
        if self.source is VectorSource.TABLE and (not self.table or self.field):
            raise ValueError('source = "table" takes a table (and no field)')
        if self.source is not VectorSource.TABLE and (not self.field or self.table):
            raise ValueError(f'source = "{self.source}" takes a field (and no table)')
        return self


if TYPE_CHECKING:
    _IndexKeys = ConfigSection[RetrievalConfig]
else:
    _IndexKeys = keys_of(RetrievalConfig, omit=("seed",))


class RetrievalSettings(_IndexKeys):
    """``[retrieval]``: the keys of :class:`model.retrieval.config.RetrievalConfig` (how the
    index is built and queried: declared, documented and checked there; made once as
    :attr:`config`, read by the model loader, which hands it to the index builders (each index
    carries it to the loop's retriever), and by the benchmarks), plus whether to retrieve, the
    catalogue, and a configured model's vectors.

    Example::

        [retrieval]
        num_candidates = 100
        index = "auto"          # flat up to exact_max_items, else ivfpq
        nprobe = 64
        catalogue = "redis"
    """

    enabled: bool = True
    """Answer events without candidates from the index; off: they go to the DLQ
    (``no_candidates``) as before."""
    catalogue: CatalogueSource = CatalogueSource.REDIS
    """Which item ids exist: ``redis`` (the item keys of the feature store: the built-in
    model's ``<prefix>:i:<id>``, a configured model's ``[features.item].key``), ``file`` or
    ``table`` (a configured model: the rows of its identity index table)."""
    catalogue_path: Path | None = None
    """With ``catalogue = "file"``: the ids (``.npy`` int64, or one per line)."""
    query: VectorSettings | None = None
    """A configured model's query vectors: ``{ source = "table", table = ... }`` or
    ``{ source = "user", field = ... }``. Required with ``[model.module]`` and ``enabled``."""
    items: VectorSettings | None = None
    """A configured model's indexed vectors: ``{ source = "table", table = ... }`` or
    ``{ source = "item", field = ... }``. Required with ``[model.module]`` and ``enabled``."""

    @model_validator(mode="after")
    def _valid(self) -> RetrievalSettings:
        if self.catalogue is CatalogueSource.FILE and self.catalogue_path is None:
            raise ValueError('catalogue = "file" needs catalogue_path')
        if self.query is not None and self.query.source is VectorSource.ITEM:
            raise ValueError('query.source = "item": the query is the user\'s (table or user)')
        if self.items is not None and self.items.source is VectorSource.USER:
            raise ValueError('items.source = "user": the index holds items (table or item)')
        return self


class ModelSwapSettings(Section):
    """``[model_swap]``: following a versions directory while serving.

    Example::

        [model_swap]
        poll_interval_s = 2.0
    """

    enabled: bool = True
    """Watch ``model.checkpoint`` when it is a versions directory (a plain checkpoint is
    served as loaded, as before)."""
    poll_interval_s: float = 2.0
    """Seconds between two reads of the versions directory's pointer (one small file)."""

    @field_validator("poll_interval_s")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be > 0")
        return value
