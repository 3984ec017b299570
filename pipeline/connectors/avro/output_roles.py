"""The roles of an output schema of the user's (``[output]``) and the Avro types they are
written as: what :mod:`pipeline.connectors.avro.write_program` compiles.

A :class:`Binding` maps one role to one field of the output schema (a dotted path; a path
crosses an array of records to name a field of each item). Per-item roles (the item id, its
ranking score, its task scores) hold one value per kept item; the others one per event. An echo
carries a field of the input event as written, so its output type must write the same bytes
(:func:`same_type`: the same type, an int into a long, the same enum symbols).

Example::

    Binding("output.items", ("ranked", "listing_id"), Role.ITEMS)
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.connectors.avro.schema_fields import named_types, resolve_named, type_name

__all__ = [
    "MILLIS",
    "PER_ITEM",
    "Binding",
    "EchoSource",
    "OutputSchemaError",
    "Role",
    "as_dict",
    "check_path",
    "plain_type",
    "same_type",
]

MILLIS = (None, "timestamp-millis", "local-timestamp-millis")
"""The logical types of a long that holds epoch milliseconds (or none)."""


class OutputSchemaError(ValueError):
    """A role the output schema cannot hold, or a field nothing fills (one line)."""


class Role(enum.StrEnum):
    """What a field of the output holds (``[output]``'s keys)."""

    EVENT_ID = "event_id"
    USER_ID = "user_id"
    ITEMS = "items"
    SCORES = "scores"
    TASK_SCORE = "task_scores"
    MODEL_VERSION = "model_version"
    SCORED_AT = "scored_at"
    EVENT_TIME = "event_time"
    FALLBACK_FEATURES = "fallback_features"
    RETRIEVED = "retrieved"
    ECHO = "echo"


PER_ITEM = frozenset({Role.ITEMS, Role.SCORES, Role.TASK_SCORE})
"""Roles with one value per kept item."""


@dataclass(frozen=True)
class EchoSource:
    """An input event field carried into the output as it was written.

    Attributes:
        column: its column of the event's raw fields (``FieldColumns.raw_*``).
        name: its dotted path in the event schema (for messages).
        node: its type (a nullable field's non-null branch).
        named: the event schema's named types.
        nullable: a null may stand in its place.
    """

    column: int
    name: str
    node: Any
    named: Mapping[str, Any]
    nullable: bool


@dataclass(frozen=True)
class Binding:
    """One role mapped to one field of the output schema.

    Attributes:
        key: the setting, for messages (``output.items``, ``output.task_scores.click``).
        path: the field's dotted path, split (an array of records is crossed: ``ranked``,
            ``item_id``).
        role: what it holds.
        column: ``task_scores``: its column of :attr:`~pipeline.types.ScoredBatch.task_scores`.
        echo: ``echo``: the input field.
    """

    key: str
    path: tuple[str, ...]
    role: Role
    column: int = 0
    echo: EchoSource | None = None

    @property
    def dotted(self) -> str:
        return ".".join(self.path)


def as_dict(node: Any) -> Mapping[str, Any]:
    """A type as a mapping: ``"long"`` -> ``{"type": "long"}``."""
    return node if isinstance(node, Mapping) else {"type": node}


def plain_type(node: Mapping[str, Any], named: Mapping[str, Any]) -> str:
    """A primitive's name (``long``), or ``array<string>``; logical types ignored."""
    kind = node.get("type")
    if kind == "array":
        items = resolve_named(node["items"], named)
        return f"array<{plain_type(as_dict(items), named)}>"
    return str(kind) if not isinstance(kind, (dict, list)) else ""


def same_type(out: Any, source: EchoSource, named: Mapping[str, Any]) -> bool:
    """Whether the output type ``out`` writes the input's bytes as they are."""
    return _same(as_dict(resolve_named(out, named)), named, source.node, source.named)


def _same(out: Mapping[str, Any], out_named: Mapping[str, Any], src: Any, src_named: Any) -> bool:
    src_d = as_dict(resolve_named(src, src_named))
    kind, src_kind = out.get("type"), src_d.get("type")
    if kind == "enum" or src_kind == "enum":
        return kind == src_kind and list(out["symbols"]) == list(src_d["symbols"])
    if kind == "array" and src_kind == "array":
        return _same(
            as_dict(resolve_named(out["items"], out_named)), out_named, src_d["items"], src_named
        )
    if kind == "long" and src_kind == "int":
        return True  # one zigzag varint either way
    return isinstance(kind, str) and kind == src_kind and kind not in ("record", "map", "fixed")


def check_path(schema: Mapping[str, Any], binding: Binding) -> None:
    """The binding's path exists (through records, unions with one record or array branch,
    and arrays of records), and crosses an array (the items) when the role has one value per
    item, none when it has one per event (one line naming the key).

    Raises:
        OutputSchemaError: a path the schema lacks, a per-item role outside the items, a
            per-event role inside them.
    """
    named = named_types(schema)
    node: Any = schema
    crossed = False
    for depth, part in enumerate(binding.path):
        here = ".".join(binding.path[:depth]) or "the output"
        node = _one_container(resolve_named(node, named), named)
        if isinstance(node, Mapping) and node.get("type") == "array":
            node = resolve_named(node["items"], named)
            crossed = True
        if not isinstance(node, Mapping) or node.get("type") != "record":
            raise OutputSchemaError(
                f"{binding.key} = {binding.dotted!r}: {here} is {type_name(node)}, not a "
                f"record: no field {part!r}"
            )
        fields = {f["name"]: f["type"] for f in node["fields"]}
        if part not in fields:
            raise OutputSchemaError(
                f"{binding.key} = {binding.dotted!r}: {here} has no field {part!r} (its "
                f"fields: {', '.join(fields)})"
            )
        node = fields[part]
    leaf = _one_container(resolve_named(node, named), named)
    holds_items = isinstance(leaf, Mapping) and leaf.get("type") == "array"
    if binding.role in PER_ITEM and not crossed and not holds_items:
        raise OutputSchemaError(
            f"{binding.key} = {binding.dotted!r} is {type_name(node)}: one value per item needs "
            "an array (an array of longs or doubles, or a path through an array of records)"
        )
    if binding.role not in PER_ITEM and crossed:
        raise OutputSchemaError(
            f"{binding.key} = {binding.dotted!r} is a field of each item; {binding.role} is "
            "one per event"
        )


def _one_container(node: Any, named: Mapping[str, Any]) -> Any:
    """A union's one record or array branch (a union with another count: as it is)."""
    if isinstance(node, list):
        inner = [resolve_named(b, named) for b in node]
        inner = [b for b in inner if as_dict(b).get("type") in ("record", "array")]
        return inner[0] if len(inner) == 1 else node
    return node
