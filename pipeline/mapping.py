"""A configured model's feature map, resolved: what each stage of the configured path reads.

Made once at start-up from ``[events]``, ``[features]`` and ``[model.module]``
(:func:`pipeline.models.mapping.resolve_feature_map`, which checks every name against the schema,
the Redis layout and the module); then plain data:

- decode (:mod:`pipeline.stages.decode`) extracts the :attr:`FeatureMap.roles` into the
  built-in :class:`~pipeline.columns.EventColumns` columns and the :attr:`FeatureMap.event_fields`
  into ``EventColumns.fields`` (:class:`~pipeline.columns.FieldColumns`);
- enrich (:mod:`pipeline.stages.enrich`) reads :attr:`FeatureMap.user` and :attr:`FeatureMap.item`
  records into ``Enrichment.user_fields`` / ``item_fields``;
- features (:mod:`pipeline.stages.features`) lays out one KJT key per :attr:`FeatureMap.sparse`
  and the dense input from :attr:`FeatureMap.dense`.

A field lives in one of three stores of its :class:`~pipeline.columns.FieldColumns`:
``ints`` (one id; a string's 64-bit hash), ``floats`` (numbers; a vector spans ``width``
columns), ``lists`` (id lists, and nullable single ids: null is an empty list).

Example::

    fmap = resolve_feature_map(settings)
    fmap.layout          # InputLayout(keys=("viewer", "offer", ...), dense_dim=5, ...)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from model.features.layout import InputLayout
from pipeline.connectors.avro.schema_fields import SchemaField
from pipeline.settings.features import OutOfRange, RecordFormat, Source, Transform

__all__ = [
    "DensePart",
    "EventField",
    "EventRoles",
    "FeatureMap",
    "RecordField",
    "RecordKind",
    "RecordLayout",
    "SparseKey",
    "Store",
]


class Store(enum.StrEnum):
    """Which array of a :class:`~pipeline.columns.FieldColumns` holds a field."""

    INTS = "ints"
    FLOATS = "floats"
    LISTS = "lists"


class RecordKind(enum.StrEnum):
    """What a Redis record field holds (``[features.user].fields``)."""

    VECTOR = "vector"
    ID = "id"
    ID_LIST = "id_list"


@dataclass(frozen=True)
class EventField:
    """One event field the decoder extracts.

    Attributes:
        field: where it is in the schema, and its kind.
        store: ``ints``, ``floats`` or ``lists``.
        column: its column in that store.
        max_ids: lists: ids kept per event (the first ones).
    """

    field: SchemaField
    store: Store
    column: int
    max_ids: int = 1


@dataclass(frozen=True)
class RecordField:
    """One field of a user's or item's Redis record.

    Attributes:
        name: its name (a hash field; the packed layout's position).
        kind: vector, id or id list.
        width: the vector's length, or the list's cap (1 for an id).
        column: ints column (id), first floats column (vector) or list index (id list).
    """

    name: str
    kind: RecordKind
    width: int
    column: int


@dataclass(frozen=True)
class RecordLayout:
    """One side's Redis records.

    Attributes:
        key: the key template (``{id}`` the decimal id).
        format: packed (the built-in binary layout, one MGET) or hash (pipelined HMGETs).
        fields: in declaration order (the packed layout's order).
    """

    key: str
    format: RecordFormat
    fields: tuple[RecordField, ...]

    def count(self, kind: RecordKind) -> int:
        """How many ints (ids), floats (vector values) or lists (id lists) a record holds."""
        chosen = [f for f in self.fields if f.kind is kind]
        return sum(f.width for f in chosen) if kind is RecordKind.VECTOR else len(chosen)

    @property
    def list_caps(self) -> tuple[int, ...]:
        """The cap of every id list, by list index."""
        return tuple(f.width for f in self.fields if f.kind is RecordKind.ID_LIST)

    def field(self, name: str) -> RecordField:
        """The field called ``name`` (:class:`KeyError` if none)."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)


@dataclass(frozen=True)
class SparseKey:
    """One KJT key: where its ids come from and how they become rows.

    Attributes:
        key: the KJT key (a feature of the module's tables).
        source: event, candidate, user or item.
        store: ``ints`` (one id per entity) or ``lists``; ignored for ``candidate``.
        column: the column (or list index) in that store.
        transform: identity, modulo or hash.
        num_rows: the table's rows.
        out_of_range: identity's outside ids: default row, or the DLQ (checked by decode).
        default_row: identity's row for an outside id with ``out_of_range = default``.
        max_ids: the most ids one row carries (1 for single ids).
        salt: the hash transform's salt.
    """

    key: str
    source: Source
    store: Store
    column: int
    transform: Transform
    num_rows: int
    out_of_range: OutOfRange = OutOfRange.DEFAULT
    default_row: int = 0
    max_ids: int = 1
    salt: int = 0


@dataclass(frozen=True)
class DensePart:
    """One part of the dense input.

    Attributes:
        name: what it is, for messages (``event.price``, ``user.taste``).
        source: event, user or item.
        column: its first column in the source's ``floats``.
        width: its columns.
        default: the value when null (event) or the record is missing (user, item).
    """

    name: str
    source: Source
    column: int
    width: int
    default: float = 0.0


@dataclass(frozen=True)
class EventRoles:
    """The schema fields that play the pipeline's roles.

    Attributes:
        event_id: string (or long) id, echoed in the Recommendation.
        user_id: long: the user whose features are read.
        candidates: array of longs: the items to rank.
        event_time: long epoch milliseconds.
        num_results: int or long; ``None``: :attr:`num_results_default` for every event.
        num_results_default: see :attr:`num_results`.
    """

    event_id: SchemaField
    user_id: SchemaField
    candidates: SchemaField
    event_time: SchemaField
    num_results: SchemaField | None
    num_results_default: int


@dataclass(frozen=True)
class FeatureMap:
    """Everything the configured path's stages read (see the module docstring).

    Attributes:
        schema: the parsed event schema (``fastavro.parse_schema``).
        schema_name: where it came from (for messages and the registry subject).
        roles: the role fields.
        event_fields: the event fields the decoder extracts, by store and column.
        user / item: the Redis layouts (``None``: nothing read for that side).
        sparse: one entry per KJT key, in key order.
        dense: the dense parts, in order.
    """

    schema: Any
    schema_name: str
    roles: EventRoles
    event_fields: tuple[EventField, ...]
    user: RecordLayout | None
    item: RecordLayout | None
    sparse: tuple[SparseKey, ...]
    dense: tuple[DensePart, ...]

    def event_count(self, store: Store) -> int:
        """Columns of the event's ``store`` (ints, floats or lists)."""
        return sum(1 for f in self.event_fields if f.store is store)

    @property
    def layout(self) -> InputLayout:
        """The model input: keys in order, dense width, most ids per row per key."""
        return InputLayout(
            tuple(k.key for k in self.sparse),
            sum(p.width for p in self.dense),
            tuple(k.max_ids for k in self.sparse),
        )
