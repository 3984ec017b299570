"""Fields of a user's event schema, found by dotted path and classified for the feature map.

A path names a field of the top-level record, or a field inside a nested record
(``viewer.id``); a record or the leaf may be nullable (``["null", T]``): a null anywhere on the
path makes the value null. Leaves are classified by what the pipeline can do with them:

============  ====================================================================
kind          Avro types
============  ====================================================================
``int``       ``long``, ``int``, ``boolean`` (any logical type: ``timestamp-millis``...)
``string``    ``string``, ``enum`` (its symbol)
``float``     ``float``, ``double``
``int_list``  ``array`` of ``long`` / ``int``
``str_list``  ``array`` of ``string`` / ``enum``
``float_list``  ``array`` of ``float`` / ``double`` (a weighted key's weights)
============  ====================================================================

Example::

    schema = load_schema(Path("page_view.avsc"))
    field = schema_field(schema, "viewer.id")     # SchemaField(("viewer", "id"), INT, False)
    value = field.read(record)                     # record["viewer"]["id"], None if null
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from model.features.mapping import FieldKind, SchemaField

__all__ = [
    "FieldKind",
    "SchemaField",
    "SchemaFieldError",
    "named_types",
    "resolve_named",
    "schema_field",
    "schema_node",
    "type_name",
]


class SchemaFieldError(ValueError):
    """A path the schema lacks, or a field of a type its role cannot use (one line)."""


_PRIMITIVE_KINDS = {
    "long": FieldKind.INT,
    "int": FieldKind.INT,
    "boolean": FieldKind.INT,
    "string": FieldKind.STRING,
    "float": FieldKind.FLOAT,
    "double": FieldKind.FLOAT,
}
_LIST_KINDS = {
    FieldKind.INT: FieldKind.INT_LIST,
    FieldKind.STRING: FieldKind.STRING_LIST,
    FieldKind.FLOAT: FieldKind.FLOAT_LIST,
}


def named_types(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The named types of a parsed schema, by full name."""
    return schema.get("__named_schemas", {})  # fastavro.parse_schema's named types


def resolve_named(node: Any, named: Mapping[str, Any]) -> Any:
    """A named type's definition for a reference by name; other nodes as they are."""
    if isinstance(node, str) and node in named:
        return named[node]
    return node


def _unwrap(node: Any, named: Mapping[str, Any], where: str) -> tuple[Any, bool]:
    """``(type, nullable)`` of ``node``, a ``["null", T]`` union unwrapped."""
    node = resolve_named(node, named)
    if isinstance(node, list):
        branches = [b for b in node if b != "null"]
        if len(branches) != 1:
            raise SchemaFieldError(
                f'{where} is a union of {len(branches)} types; only ["null", T] is read'
            )
        return resolve_named(branches[0], named), len(branches) != len(node)
    return node, False


def type_name(node: Any) -> str:
    """A type as messages name it: ``long``, ``array<string>``, ``enum Device``..."""
    if isinstance(node, list):
        return "[" + ", ".join(type_name(b) for b in node) + "]"
    if isinstance(node, str):
        return node.rpartition(".")[2]
    kind = node.get("type")
    if kind == "array":
        return f"array<{type_name(node['items'])}>"
    if kind in ("record", "enum", "fixed"):
        return f"{kind} {str(node.get('name', '')).rpartition('.')[2]}"
    logical = node.get("logicalType")
    return f"{kind} ({logical})" if logical else str(kind)


def _leaf_kind(node: Any, named: Mapping[str, Any]) -> FieldKind | None:
    if isinstance(node, str):
        return _PRIMITIVE_KINDS.get(node)
    kind = node.get("type")
    if kind == "enum":
        return FieldKind.STRING
    if kind == "array":
        item, item_nullable = _unwrap(node["items"], named, "an array's items")
        inner = _leaf_kind(item, named)
        return None if item_nullable or inner is None else _LIST_KINDS.get(inner)
    if isinstance(kind, str) and kind in _PRIMITIVE_KINDS:
        return _PRIMITIVE_KINDS[kind]  # {"type": "long", "logicalType": ...}
    return None


def schema_field(schema: Mapping[str, Any], dotted: str) -> SchemaField:
    """Find and classify the field at ``dotted`` in a parsed record schema.

    Args:
        schema: ``fastavro.parse_schema`` of a record schema.
        dotted: e.g. ``"user_id"`` or ``"viewer.id"``.

    Returns:
        The field.

    Raises:
        SchemaFieldError: no such field (the message lists the record's fields), a path
            through something that is not a record, a union of several types, or a type the
            pipeline does not read (bytes, fixed, map, record, arrays of those).
    """
    node, nullable = schema_node(schema, dotted)
    kind = _leaf_kind(node, named_types(schema))
    if kind is None:
        raise SchemaFieldError(
            f"{dotted} is {type_name(node)}: only long, int, boolean, string, enum, float, "
            "double and arrays of long/int/string/float/double are read"
        )
    return SchemaField(tuple(dotted.split(".")), kind, nullable, type_name(node))


def schema_node(schema: Mapping[str, Any], dotted: str) -> tuple[Any, bool]:
    """The type of the field at ``dotted`` (named types resolved, a ``["null", T]`` union
    unwrapped) and whether a null may stand in its place (or in a record's on its path).

    Raises:
        SchemaFieldError: no such field, a path through something that is not a record, or a
            union of several types.
    """
    named = named_types(schema)
    node: Any = schema
    nullable = False
    path = tuple(dotted.split("."))
    for depth, part in enumerate(path):
        here = ".".join(path[:depth]) or "the event"
        if not isinstance(node, Mapping) or node.get("type") != "record":
            raise SchemaFieldError(f"{here} is {type_name(node)}, not a record: no field {part!r}")
        fields = {f["name"]: f["type"] for f in node["fields"]}
        if part not in fields:
            raise SchemaFieldError(
                f"{here} has no field {part!r} (its fields: {', '.join(fields)})"
            )
        node, null_here = _unwrap(fields[part], named, ".".join(path[: depth + 1]))
        nullable = nullable or null_here
    return node, nullable
