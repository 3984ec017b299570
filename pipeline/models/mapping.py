"""Resolving a configured model's feature map: ``[events]`` + ``[features]`` + ``[model.module]``
-> :class:`~model.features.mapping.FeatureMap`, every name checked at start-up.

The event schema's side is :mod:`pipeline.models.schema`, the Redis records'
:mod:`pipeline.models.records`. Each mistake is one :class:`FeatureMapError` line naming the
key: a schema file that does not
parse, a role or feature field the schema lacks or holds with the wrong type, a KJT key the
module's tables lack (or a table feature without a key), a Redis field that is not declared or
of the wrong kind, a transform the field cannot take, a ``missing`` policy for a value that is
never missing or a ``missing_row`` / ``missing_id`` the table cannot take, ``weights`` for a key
whose collection takes none or that are not a float array (a Redis ``weights`` field) paired
with the key's ids.

Example::

    fmap = resolve_feature_map(settings)   # raises FeatureMapError (a ValueError)
"""

from __future__ import annotations

from typing import Any

from model.features.mapping import (
    DensePart,
    EventField,
    FeatureMap,
    Missing,
    RecordKind,
    RecordLayout,
    SparseKey,
    Store,
)
from model.features.spec import string_to_id
from model.module.types import ModuleConfig, TableConfig
from pipeline.connectors.avro.schema_fields import FieldKind, SchemaField
from pipeline.models.records import record_field, record_layout, record_weights
from pipeline.models.schema import FeatureMapError, event_roles, load_event_schema, schema_leaf
from pipeline.settings.features import (
    DenseSettings,
    OutOfRange,
    Source,
    SparseSettings,
    Transform,
)
from pipeline.settings.loading import Settings

__all__ = ["FeatureMapError", "load_event_schema", "resolve_feature_map"]

_ID_KINDS = {FieldKind.INT, FieldKind.STRING}
_LIST_KINDS = {FieldKind.INT_LIST, FieldKind.STRING_LIST}
_NUMBER_KINDS = {FieldKind.INT, FieldKind.FLOAT}
_STRING_KINDS = {FieldKind.STRING, FieldKind.STRING_LIST}
_INT64 = range(-(2**63), 2**63)
_NAMES = {
    RecordKind.VECTOR: "a vector",
    RecordKind.ID: "an id",
    RecordKind.ID_LIST: "an id_list",
    RecordKind.WEIGHTS: "a weights field",
}


class _EventFields:
    """The event fields the decoder extracts, each path once per store."""

    def __init__(self) -> None:
        self.fields: list[EventField] = []

    def add(
        self,
        field: SchemaField,
        store: Store,
        max_ids: int = 1,
        weights: SchemaField | None = None,
        key: str = "",
    ) -> int:
        for f in self.fields:
            same = f.field.path == field.path and f.store is store and f.max_ids == max_ids
            if same and f.weights == weights and (weights is None or f.key == key):
                return f.column
        column = sum(1 for f in self.fields if f.store is store)
        self.fields.append(EventField(field, store, column, max_ids, weights, key))
        return column


def _check_weighted(
    where: str, cfg: SparseSettings, table: TableConfig, module: ModuleConfig
) -> None:
    """``weights`` only for a key of a weighted pooled collection (one line otherwise)."""
    if not cfg.weights:
        return
    if table.sequence:
        raise FeatureMapError(
            f"{where}.weights: {table.name} is a sequence table (an EmbeddingCollection takes "
            "no weights); drop weights"
        )
    if not module.weighted:
        raise FeatureMapError(
            f"{where}.weights: model.module.weighted is false (the EmbeddingBagCollection "
            "takes no weights); set it, or drop weights"
        )


def _sparse(
    key: str,
    cfg: SparseSettings,
    rows: int,
    schema: Any,
    events: _EventFields,
    records: dict[Source, RecordLayout | None],
    salt: int,
) -> SparseKey:
    where = f"features.sparse.{key}"
    store, column, max_ids = Store.INTS, 0, 1
    never, strings = "a candidate id is never missing", False
    if cfg.source is Source.EVENT:
        found = schema_leaf(
            schema, cfg.field, f"{where}.field", _ID_KINDS | _LIST_KINDS,
            "a sparse feature",
        )  # fmt: skip
        if found.kind in _STRING_KINDS and (cfg.transform is Transform.IDENTITY):
            raise FeatureMapError(
                f"{where}: {found.name} is a string (hashed to 64 bits): use transform = "
                "'modulo' or 'hash', not 'identity'"
            )
        never = "" if found.nullable else f"{found.name} is never missing (not nullable)"
        strings = found.kind in _STRING_KINDS
        weights = None
        if cfg.weights:
            if found.kind not in _LIST_KINDS:
                raise FeatureMapError(
                    f"{where}.weights: weights pair with an array of ids, and {found.name} is "
                    f"{found.avro_type}"
                )
            weights = schema_leaf(
                schema, cfg.weights, f"{where}.weights", {FieldKind.FLOAT_LIST}, "a key's weights"
            )
        if found.kind in _LIST_KINDS or found.nullable:
            store, max_ids = Store.LISTS, cfg.max_ids if found.kind in _LIST_KINDS else 1
            column = events.add(found, Store.LISTS, max_ids, weights, key if weights else "")
        else:
            column = events.add(found, Store.INTS)
    elif cfg.source in (Source.USER, Source.ITEM):
        rf = record_field(where, cfg.source, cfg.field, records)
        never = ""
        if rf.kind in (RecordKind.VECTOR, RecordKind.WEIGHTS):
            raise FeatureMapError(
                f"{where}.field = {cfg.field!r} is {_NAMES[rf.kind]}: a sparse feature needs an id "
                "or an id_list (a vector is a [[features.dense]] part)"
            )
        if cfg.weights:
            record_weights(where, cfg, rf, records)
        if cfg.transform is Transform.IDENTITY and cfg.out_of_range is OutOfRange.DLQ:
            raise FeatureMapError(
                f"{where}: out_of_range = 'dlq' is for event and candidate ids (a Redis value "
                "is not part of the event): use 'default'"
            )
        store = Store.LISTS if rf.kind is RecordKind.ID_LIST else Store.INTS
        column, max_ids = rf.column, rf.width
    if cfg.transform is Transform.IDENTITY and cfg.default_row >= rows:
        raise FeatureMapError(f"{where}.default_row = {cfg.default_row}: the table has {rows} rows")
    missing_row, missing_id = _missing(where, cfg, rows, never, strings)
    return SparseKey(
        key, cfg.source, store, column, cfg.transform, rows, cfg.out_of_range,
        cfg.default_row, max_ids, salt, cfg.missing, missing_row, missing_id, bool(cfg.weights),
    )  # fmt: skip


def _missing(
    where: str, cfg: SparseSettings, rows: int, never: str, strings: bool
) -> tuple[int, int]:
    """A key's ``missing_row`` and raw ``missing_id`` (0 where unused), checked against its
    table; ``never``: why the key's value is never missing (``""``: it can be)."""
    if cfg.missing is Missing.EMPTY:
        return 0, 0
    if never:
        raise FeatureMapError(f"{where}.missing = '{cfg.missing}': {never}; drop missing")
    if cfg.missing is Missing.ROW:
        assert cfg.missing_row is not None  # the settings' own check
        if cfg.missing_row >= rows:
            raise FeatureMapError(
                f"{where}.missing_row = {cfg.missing_row}: the table has {rows} rows"
            )
        return cfg.missing_row, 0
    value = cfg.missing_id
    if isinstance(value, str):
        if not strings:
            raise FeatureMapError(
                f"{where}.missing_id = {value!r}: a string is for a string field; give an id"
            )
        return 0, string_to_id(value)
    assert value is not None  # the settings' own check
    if value not in _INT64:
        raise FeatureMapError(f"{where}.missing_id = {value}: not a signed 64-bit id")
    if cfg.transform is Transform.IDENTITY and not 0 <= value < rows:
        raise FeatureMapError(
            f"{where}.missing_id = {value}: outside the table's {rows} rows (transform = "
            "'identity'); use missing = 'row' for a row of the table"
        )
    return 0, value


def _dense(
    index: int,
    cfg: DenseSettings,
    schema: Any,
    events: _EventFields,
    records: dict[Source, RecordLayout | None],
) -> DensePart:
    where = f"features.dense[{index}]"
    if cfg.source is Source.EVENT:
        found = schema_leaf(schema, cfg.field, f"{where}.field", _NUMBER_KINDS, "a dense part")
        column = events.add(found, Store.FLOATS)
        return DensePart(f"event.{found.name}", cfg.source, column, 1, cfg.default)
    rf = record_field(where, cfg.source, cfg.field, records)
    if rf.kind is not RecordKind.VECTOR:
        raise FeatureMapError(
            f"{where}.field = {cfg.field!r} is {_NAMES[rf.kind]}: a dense part needs a vector"
        )
    return DensePart(f"{cfg.source}.{rf.name}", cfg.source, rf.column, rf.width, cfg.default)


def resolve_feature_map(settings: Settings, module: ModuleConfig | None = None) -> FeatureMap:
    """The feature map ``settings`` describe, checked against the schema and the module.

    Args:
        settings: ``[events]``, ``[features]`` and ``[model.module]``.
        module: the module config (default ``settings.model.module.config``).

    Returns:
        The resolved map (KJT keys in the order of the module's tables' features).

    Raises:
        FeatureMapError: the first mistake, in one line naming its key.
    """
    if module is None:
        if settings.model.module is None:
            raise FeatureMapError("[features] maps a configured model: set [model.module]")
        module = settings.model.module.config
    features = settings.features
    schema, schema_name = load_event_schema(settings.events.schema_file)
    roles = event_roles(settings, schema)
    records = {
        Source.USER: record_layout("user", features.user),
        Source.ITEM: record_layout("item", features.item),
    }
    tables = {f: t for t in module.tables for f in t.feature_names}
    managed = module.managed_collision
    rows = {  # a managed table's keys map raw ids into its remapper's input range
        f: managed.input_hash_size if managed and not t.sequence else t.num_embeddings
        for f, t in tables.items()
    }
    for key in features.sparse:
        if key not in rows:
            raise FeatureMapError(
                f"features.sparse.{key}: the module has no embedding feature {key!r} (its "
                f"features: {', '.join(rows)})"
            )
    events = _EventFields()
    sparse = []
    for key, num_rows in rows.items():
        cfg = features.sparse.get(key)
        if cfg is None:
            raise FeatureMapError(
                f"model.module.tables: feature {key!r} has no [features.sparse.{key}]"
            )
        _check_weighted(f"features.sparse.{key}", cfg, tables[key], module)
        sparse.append(_sparse(key, cfg, num_rows, schema, events, records, features.hash_salt))
    dense = [_dense(i, cfg, schema, events, records) for i, cfg in enumerate(features.dense)]
    if not dense:
        raise FeatureMapError("features.dense: declare at least one [[features.dense]] part")
    for name, dotted in settings.output.echo.items():  # carried into the output as written
        found = schema_leaf(
            schema, dotted, f"output.echo.{name}", set(FieldKind), "an echoed field"
        )
        events.add(found, Store.RAW)
    return FeatureMap(
        schema, schema_name, roles, tuple(events.fields), records[Source.USER],
        records[Source.ITEM], tuple(sparse), tuple(dense), module.weighted,
    )  # fmt: skip
