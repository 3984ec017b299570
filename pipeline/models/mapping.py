"""Resolving a configured model's feature map: ``[events]`` + ``[features]`` + ``[model.module]``
-> :class:`~model.features.mapping.FeatureMap`, every name checked at start-up.

Each mistake is one :class:`FeatureMapError` line naming the key: a schema file that does not
parse, a role or feature field the schema lacks or holds with the wrong type, a KJT key the
module's tables lack (or a table feature without a key), a Redis field that is not declared or
of the wrong kind, a transform the field cannot take, a ``missing`` policy for a value that is
never missing or a ``missing_row`` / ``missing_id`` the table cannot take.

Example::

    fmap = resolve_feature_map(settings)   # raises FeatureMapError (a ValueError)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model.features.mapping import (
    DensePart,
    EventField,
    EventRoles,
    FeatureMap,
    Missing,
    RecordField,
    RecordKind,
    RecordLayout,
    SparseKey,
    Store,
)
from model.features.spec import string_to_id
from model.module.types import ModuleConfig
from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE
from pipeline.connectors.avro.schema_fields import (
    FieldKind,
    SchemaField,
    SchemaFieldError,
    schema_field,
)
from pipeline.connectors.avro.schema_registry import SchemaFileError, load_record_schema
from pipeline.settings.features import (
    DenseSettings,
    EntitySettings,
    OutOfRange,
    RecordFormat,
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
_MAX_RECORD_FIELDS = 63
"""Fields of one Redis record: the enricher keeps which are present as the bits of one int64."""
_INT64 = range(-(2**63), 2**63)
_PACKED_SHAPES = {
    "user": ((RecordKind.VECTOR,), (RecordKind.VECTOR, RecordKind.ID_LIST)),
    "item": ((RecordKind.ID, RecordKind.VECTOR),),
}
"""The field kinds, in order, the built-in packed layout holds on each side."""


class FeatureMapError(ValueError):
    """A mistake in ``[events]`` or ``[features]``, told in one line naming the key."""


def load_event_schema(path: Path | None) -> tuple[Any, str]:
    """The parsed event schema at ``path`` (``None``: the built-in UserEvent) and its name.

    Raises:
        FeatureMapError: the file is missing, not JSON, not a schema, or not a record.
    """
    chosen = path or USER_EVENT_SCHEMA_FILE
    try:
        return load_record_schema(chosen, "events.schema_file", "the event"), str(chosen)
    except SchemaFileError as exc:
        raise FeatureMapError(str(exc)) from exc


def _field(schema: Any, dotted: str, key: str, kinds: set[FieldKind], what: str) -> SchemaField:
    try:
        found = schema_field(schema, dotted)
    except SchemaFieldError as exc:
        raise FeatureMapError(f"{key} = {dotted!r}: {exc}") from exc
    if found.kind not in kinds:
        raise FeatureMapError(
            f"{key} = {dotted!r} is {found.avro_type}; {what} needs "
            f"{' or '.join(sorted(k.value for k in kinds))}"
        )
    return found


def _roles(settings: Settings, schema: Any) -> EventRoles:
    events = settings.events

    def role(name: str, kinds: set[FieldKind], what: str) -> SchemaField:
        found = _field(schema, getattr(events, name), f"events.{name}", kinds, what)
        if found.nullable and name != "num_results":
            raise FeatureMapError(f"events.{name} = {found.name!r} is nullable; the role is not")
        return found

    return EventRoles(
        event_id=role("event_id", {FieldKind.STRING, FieldKind.INT}, "the event id"),
        user_id=role("user_id", {FieldKind.INT}, "the user id"),
        candidates=role("candidates", {FieldKind.INT_LIST}, "the candidate list"),
        event_time=role("event_time", {FieldKind.INT}, "the event time (epoch ms)"),
        num_results=(
            role("num_results", {FieldKind.INT}, "num_results") if events.num_results else None
        ),
        num_results_default=events.num_results_default,
    )


def _record(side: str, entity: EntitySettings | None) -> RecordLayout | None:
    if entity is None:
        return None
    if len(entity.fields) > _MAX_RECORD_FIELDS:
        raise FeatureMapError(
            f"features.{side}.fields: {len(entity.fields)} fields; a record holds at most "
            f"{_MAX_RECORD_FIELDS}"
        )
    counts = dict.fromkeys(RecordKind, 0)
    fields = []
    for name, text in entity.fields.items():
        kind_text, _, width_text = text.partition(":")
        try:
            kind = RecordKind(kind_text)
            width = int(width_text) if width_text else 1
            if (kind is RecordKind.ID) == bool(width_text) or width < 1:
                raise ValueError
        except ValueError:
            raise FeatureMapError(
                f"features.{side}.fields.{name} = {text!r}: expected 'vector:N', 'id' or "
                "'id_list:N'"
            ) from None
        column = counts[kind]
        counts[kind] += width if kind is RecordKind.VECTOR else 1
        fields.append(RecordField(name, kind, width, column))
    if entity.format is RecordFormat.PACKED:
        shape = tuple(f.kind for f in fields)
        if shape not in _PACKED_SHAPES[side]:
            wanted = " or ".join(
                "(" + ", ".join(k.value for k in s) + ")" for s in _PACKED_SHAPES[side]
            )
            raise FeatureMapError(
                f"features.{side}.fields: the packed layout holds {wanted} in that order, "
                f"got ({', '.join(k.value for k in shape)})"
            )
    return RecordLayout(entity.key, entity.format, tuple(fields))


class _EventFields:
    """The event fields the decoder extracts, each path once per store."""

    def __init__(self) -> None:
        self.fields: list[EventField] = []

    def add(self, field: SchemaField, store: Store, max_ids: int = 1) -> int:
        for f in self.fields:
            if f.field.path == field.path and f.store is store and f.max_ids == max_ids:
                return f.column
        column = sum(1 for f in self.fields if f.store is store)
        self.fields.append(EventField(field, store, column, max_ids))
        return column


def _record_field(
    where: str, source: Source, name: str, records: dict[Source, RecordLayout | None]
) -> RecordField:
    """The field ``name`` of ``source``'s Redis record (one line naming ``where`` if none)."""
    record = records[source]
    if record is None:
        raise FeatureMapError(f"{where}: source = '{source}' needs [features.{source}]")
    try:
        return record.field(name)
    except KeyError:
        raise FeatureMapError(
            f"{where}.field = {name!r}: [features.{source}] declares no such field (its "
            f"fields: {', '.join(f.name for f in record.fields)})"
        ) from None


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
        found = _field(
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
        if found.kind in _LIST_KINDS or found.nullable:
            store, max_ids = Store.LISTS, cfg.max_ids if found.kind in _LIST_KINDS else 1
            column = events.add(found, Store.LISTS, max_ids)
        else:
            column = events.add(found, Store.INTS)
    elif cfg.source in (Source.USER, Source.ITEM):
        rf = _record_field(where, cfg.source, cfg.field, records)
        never = ""
        if rf.kind is RecordKind.VECTOR:
            raise FeatureMapError(
                f"{where}.field = {cfg.field!r} is a vector: a sparse feature needs an id or "
                "an id_list (a vector is a [[features.dense]] part)"
            )
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
        cfg.default_row, max_ids, salt, cfg.missing, missing_row, missing_id,
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
        found = _field(schema, cfg.field, f"{where}.field", _NUMBER_KINDS, "a dense part")
        column = events.add(found, Store.FLOATS)
        return DensePart(f"event.{found.name}", cfg.source, column, 1, cfg.default)
    rf = _record_field(where, cfg.source, cfg.field, records)
    if rf.kind is not RecordKind.VECTOR:
        raise FeatureMapError(
            f"{where}.field = {cfg.field!r} is an {rf.kind}: a dense part needs a vector"
        )
    return DensePart(f"{cfg.source}.{rf.name}", cfg.source, rf.column, rf.width, cfg.default)


def resolve_feature_map(settings: Settings, module: ModuleConfig | None = None) -> FeatureMap:
    """The feature map ``settings`` describe, checked against the schema and the module.

    Args:
        settings: ``[events]``, ``[features]`` and ``[model.module]``.
        module: the module config (default ``settings.model.module.to_config()``).

    Returns:
        The resolved map (KJT keys in the order of the module's tables' features).

    Raises:
        FeatureMapError: the first mistake, in one line naming its key.
    """
    if module is None:
        if settings.model.module is None:
            raise FeatureMapError("[features] maps a configured model: set [model.module]")
        module = settings.model.module.to_config()
    features = settings.features
    schema, schema_name = load_event_schema(settings.events.schema_file)
    roles = _roles(settings, schema)
    records = {
        Source.USER: _record("user", features.user),
        Source.ITEM: _record("item", features.item),
    }
    rows = {f: t.num_embeddings for t in module.tables for f in t.feature_names}
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
        sparse.append(_sparse(key, cfg, num_rows, schema, events, records, features.hash_salt))
    dense = [_dense(i, cfg, schema, events, records) for i, cfg in enumerate(features.dense)]
    if not dense:
        raise FeatureMapError("features.dense: declare at least one [[features.dense]] part")
    for name, dotted in settings.output.echo.items():  # carried into the output as written
        found = _field(schema, dotted, f"output.echo.{name}", set(FieldKind), "an echoed field")
        events.add(found, Store.RAW)
    return FeatureMap(
        schema, schema_name, roles, tuple(events.fields), records[Source.USER],
        records[Source.ITEM], tuple(sparse), tuple(dense),
    )  # fmt: skip
