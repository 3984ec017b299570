"""Where a configured model's retrieval vectors come from (plain data, no Faiss or torch import:
configuration loading uses it).

With ``[model.module]``, ``retrieval.query`` and ``retrieval.items`` name the vectors that query
and the vectors that are indexed: one of the module's tables (a row per id, through the
transform of the key that looks the table up with that id), or a ``vector:N`` field of the
user's or the item's Redis record. ``pipeline.models.retrieval.resolve_retrieval`` checks the
names against the module, the feature map and the Redis layouts at start-up and makes a
:class:`RetrievalPlan`; the model loader builds each version's index from it
(``pipeline.models.configured_index``).

Example::

    plan.query    # TableVectors(table="t_viewer", ...) or RecordVectors(side="user", ...)
    plan.items.dim == plan.query.dim
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from model.features.mapping import RecordField, RecordLayout, SparseKey

__all__ = ["RecordVectors", "RetrievalPlan", "TableVectors", "VectorSource"]


class VectorSource(enum.StrEnum):
    """``retrieval.query.source`` / ``retrieval.items.source``."""

    TABLE = "table"
    """A table of the module: the query is the user's row, the index holds each item's row."""
    USER = "user"
    """A ``vector:N`` field of the user's Redis record (the query only)."""
    ITEM = "item"
    """A ``vector:N`` field of each item's Redis record (the index only)."""


@dataclass(frozen=True)
class TableVectors:
    """Vectors that are rows of one of the module's tables, read from a version's weights.

    Attributes:
        table: the table's name (``[[model.module.tables]]``).
        state_key: its weights' key in the module's ``state_dict`` (a version's ``model.pt``).
        num_rows: its rows.
        dim: its width.
        key: the KJT key whose transform turns an id into a row: the key of the user id (the
            query) or of the candidate item id (the index).
    """

    table: str
    state_key: str
    num_rows: int
    dim: int
    key: SparseKey


@dataclass(frozen=True)
class RecordVectors:
    """A ``vector:N`` field of the user's (the query) or each item's (the index) Redis record.

    Attributes:
        side: ``user`` or ``item``.
        layout: that side's Redis layout (``[features.user]`` / ``[features.item]``).
        field: the vector field.
    """

    side: VectorSource
    layout: RecordLayout
    field: RecordField

    @property
    def dim(self) -> int:
        """The vector's width (its ``vector:N``)."""
        return self.field.width


@dataclass(frozen=True)
class RetrievalPlan:
    """A configured model's retrieval, resolved at start-up.

    Attributes:
        query: the vectors that query (one per event: its user's).
        items: the vectors that are indexed (one per catalogue item).
        item_id_limit: catalogue ids must be below it (and not negative): ``codec.max_id + 1``,
            or the rows of a candidate key's ``identity`` table with ``out_of_range = "dlq"``
            when fewer (such an id would dead-letter the event it was retrieved for).
        catalogue_key: ``[features.item].key`` (``retrieval.catalogue = "redis"`` lists the keys
            of this template); ``""`` without ``[features.item]``.
        catalogue_rows: with ``retrieval.catalogue = "table"``: the rows of the index table,
            which are the item ids (its candidate key's transform is ``identity``); else 0.
    """

    query: TableVectors | RecordVectors
    items: TableVectors | RecordVectors
    item_id_limit: int
    catalogue_key: str = ""
    catalogue_rows: int = 0
