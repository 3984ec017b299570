"""A configured model's feature map: how raw event fields, candidate ids and Redis records
become the model's input (with ``[model.module]``; the built-in model's is fixed, see
:mod:`model.features.spec`).

Plain data, no torch: resolved once at start-up from the configuration
(``pipeline.models.mapping.resolve_feature_map`` checks every name against the event schema,
the Redis layout and the module), then read by the configured decode, enrich and features
stages:

- decode extracts the :attr:`FeatureMap.roles` (event id, user id, candidates, event time,
  number of results) and the :attr:`FeatureMap.event_fields` of each event;
- enrich reads the :attr:`FeatureMap.user` and :attr:`FeatureMap.item` records from Redis;
- features lays out one KJT key per :attr:`FeatureMap.sparse` and the dense input from
  :attr:`FeatureMap.dense`.

A field lives in one of the stores of its columns: ``ints`` (one id; a string's 64-bit hash),
``floats`` (numbers; a vector spans ``width`` columns), ``lists`` (id lists, and nullable single
ids: null is an absent list; a list of a weighted key carries its weights beside its ids, 1.0
where a list has none); an event field an output schema carries through (``[output]``'s
``echo``) also in ``raw`` (its Avro bytes). Where a value can be absent (a null event field, a
Redis record or field that is missing or malformed), the columns say so (``int_present`` /
``list_present``, NaN floats) and each key's :class:`Missing` policy says what the model
receives instead.

Example::

    fmap.layout   # InputLayout(keys=("viewer", "offer", ...), dense_dim=7, ...)
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from model.features.layout import InputLayout

__all__ = [
    "DensePart",
    "EventField",
    "EventRoles",
    "FeatureMap",
    "FieldKind",
    "Missing",
    "OutOfRange",
    "RecordField",
    "RecordFormat",
    "RecordKind",
    "RecordLayout",
    "SchemaField",
    "Source",
    "SparseKey",
    "Store",
    "Transform",
]


class Source(enum.StrEnum):
    """Where a feature's values come from."""

    EVENT = "event"
    """A field of the event (``field``: its dotted path in the schema)."""
    CANDIDATE = "candidate"
    """The candidate item's id (one per row)."""
    USER = "user"
    """A field of the event's user's Redis record (``[features.user]``)."""
    ITEM = "item"
    """A field of the candidate item's Redis record (``[features.item]``)."""


class Transform(enum.StrEnum):
    """How an id becomes a row of the key's table (``num_embeddings`` rows)."""

    IDENTITY = "identity"
    """The id is the row; ids outside ``[0, num_embeddings)`` follow ``out_of_range``."""
    MODULO = "modulo"
    """``id mod num_embeddings`` (never negative)."""
    HASH = "hash"
    """streamrank's salted 64-bit hash (``model.features.spec.hash_to_rows``), mod the size."""


class OutOfRange(enum.StrEnum):
    """What ``identity`` does with an id outside the table."""

    DEFAULT = "default"
    """Look up ``default_row`` instead."""
    DLQ = "dlq"
    """Dead-letter the event (``id_out_of_range``, naming the key); event and candidate ids."""


class Missing(enum.StrEnum):
    """What a key's bag holds where its value is missing (a null event field, a Redis record or
    field that is missing or malformed): what the model was trained with."""

    EMPTY = "empty"
    """An empty bag (length 0: a sum-pooled zero vector, a mean-pooled zero vector)."""
    ROW = "row"
    """One id: ``missing_row``, a row of the table as it is (no transform)."""
    ID = "id"
    """One id: the raw id ``missing_id``, through the key's transform like any other."""


class RecordFormat(enum.StrEnum):
    """How a Redis record is stored."""

    PACKED = "packed"
    """The built-in binary layout, read with one MGET: users ``float32[dim]`` + ``int64[n]``
    (fields ``dense = "vector:dim"``, ``recent = "id_list:cap"``), items ``int64`` +
    ``float32[dim]`` (``category = "id"``, ``dense = "vector:dim"``)."""
    HASH = "hash"
    """A Redis hash with one field per name, read with pipelined HMGETs in one round trip:
    ``vector:N`` float32 little-endian bytes, ``id`` a decimal integer, ``id_list:N`` int64
    little-endian bytes (the first N kept)."""


class FieldKind(enum.StrEnum):
    """What a schema field holds, as the feature map sees it (module docstring)."""

    INT = "int"
    STRING = "string"
    FLOAT = "float"
    INT_LIST = "int_list"
    STRING_LIST = "str_list"
    FLOAT_LIST = "float_list"


@dataclass(frozen=True)
class SchemaField:
    """One leaf field of the schema.

    Attributes:
        path: record field names from the top-level record to the leaf.
        kind: what it holds (module docstring).
        nullable: a null may stand in its place (or in a record's on its path).
        avro_type: its Avro type, for messages (``long``, ``array<string>``...).
    """

    path: tuple[str, ...]
    kind: FieldKind
    nullable: bool
    avro_type: str

    @property
    def name(self) -> str:
        """The dotted path."""
        return ".".join(self.path)

    def read(self, record: Mapping[str, Any]) -> Any:
        """The field's value in a decoded record (``None`` where null)."""
        value: Any = record
        for part in self.path:
            if value is None:
                return None
            value = value[part]
        return value


class Store(enum.StrEnum):
    """Which array of a :class:`~pipeline.columns.FieldColumns` holds a field."""

    INTS = "ints"
    FLOATS = "floats"
    LISTS = "lists"
    RAW = "raw"
    """The field's Avro encoding as it was written (carried into the output: ``echo``)."""


class RecordKind(enum.StrEnum):
    """What a Redis record field holds (``[features.user].fields``)."""

    VECTOR = "vector"
    ID = "id"
    ID_LIST = "id_list"
    WEIGHTS = "weights"
    """The weights of an id list of the same record (``weights:<id_list field>``), float32
    little-endian, one per id: kept in the float columns, ``width`` (the list's cap) wide."""


@dataclass(frozen=True)
class EventField:
    """One event field the decoder extracts.

    Attributes:
        field: where it is in the schema, and its kind.
        store: ``ints``, ``floats`` or ``lists``.
        column: its column in that store.
        max_ids: lists: ids kept per event (the first ones).
        weights: lists: a float array of the same length, the ids' weights (a weighted key's
            ``weights``); ``None``: the list's weights are 1.0.
        key: the weighted key the weights are for (named in a dead letter's detail).
    """

    field: SchemaField
    store: Store
    column: int
    max_ids: int = 1
    weights: SchemaField | None = None
    key: str = ""


@dataclass(frozen=True)
class RecordField:
    """One field of a user's or item's Redis record.

    Attributes:
        name: its name (a hash field; the packed layout's position).
        kind: vector, id, id list, or an id list's weights.
        width: the vector's length, or the list's cap (1 for an id; weights: their list's).
        column: ints column (id), first floats column (vector, weights) or list index (id
            list).
        pairs: weights: the list index of the id list they weigh (-1 for other kinds).
    """

    name: str
    kind: RecordKind
    width: int
    column: int
    pairs: int = -1


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
        """How many ints (ids), lists (id lists) or weight lists a record holds, or for
        ``VECTOR`` how many float columns (vector values and weights, which share them)."""
        if kind is RecordKind.VECTOR:
            floats = (RecordKind.VECTOR, RecordKind.WEIGHTS)
            return sum(f.width for f in self.fields if f.kind in floats)
        return sum(1 for f in self.fields if f.kind is kind)

    def weights_of(self, list_index: int) -> RecordField | None:
        """The weights field of id list ``list_index`` (``None``: it has none)."""
        return next(
            (f for f in self.fields if f.kind is RecordKind.WEIGHTS and f.pairs == list_index),
            None,
        )

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
        missing: what a missing value gives (:class:`Missing`).
        missing_row: with ``missing = row``: the row it looks up.
        missing_id: with ``missing = id``: the raw id it stands for (a string's 64-bit id).
        weighted: its list carries weights (``weights``: an event array, or a Redis
            ``weights`` field); else each id weighs 1.0 (when the KJT carries weights).
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
    missing: Missing = Missing.EMPTY
    missing_row: int = 0
    missing_id: int = 0
    weighted: bool = False


@dataclass(frozen=True)
class DensePart:
    """One part of the dense input.

    Attributes:
        name: what it is, for messages (``event.price``, ``user.taste``).
        source: event, user or item.
        column: its first column in the source's ``floats``.
        width: its columns.
        default: every value where the field is null (event), or the record or its field is
            missing or malformed (user, item).
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
        weighted: the KJT carries a weight per id (the module's pooled collection is
            weighted): a weighted key's from its list, 1.0 for every other id.
    """

    schema: Any
    schema_name: str
    roles: EventRoles
    event_fields: tuple[EventField, ...]
    user: RecordLayout | None
    item: RecordLayout | None
    sparse: tuple[SparseKey, ...]
    dense: tuple[DensePart, ...]
    weighted: bool = False

    def event_count(self, store: Store) -> int:
        """Columns of the event's ``store`` (ints, floats, lists or raw)."""
        return sum(1 for f in self.event_fields if f.store is store)

    @property
    def layout(self) -> InputLayout:
        """The model input: keys in order, dense width, most ids per row per key, weights."""
        return InputLayout(
            tuple(k.key for k in self.sparse),
            sum(p.width for p in self.dense),
            tuple(k.max_ids for k in self.sparse),
            self.weighted,
        )
