"""Any record schema as a flat *program* the compiled walker interprets
(:mod:`pipeline.connectors.avro.walker`): the configured path's fast decode, no Python object
per event.

The schema's type tree is flattened into arrays of nodes (named types expanded where they are
used; a recursive type is refused, and such a schema decodes with fastavro alone). Each leaf
the feature map reads (a role, a feature field) gets an output *slot* of its store:

==========  =====================================  =========================================
store       Avro leaf                              per event and slot
==========  =====================================  =========================================
``int``     long, int, boolean, enum (its index)   int64 value, present flag
``float``   float, double                          float64 value, present flag
``str``     string                                 start, bytes, characters, present flag
``list``    array of long / int / enum / float /   its items (flat; a float or double as its
            double                                 float64 bits), start and count
``strs``    array of string                        its items' (start, bytes), start and count
==========  =====================================  =========================================

A leaf behind a null (a nullable field, or a nullable record on its path) is simply never
reached: its present flag stays 0. A leaf can also be asked for *raw* (``raw``): where its Avro
encoding starts and ends in the body (an event field carried into the output as written).

Example::

    program = compile_program(schema, [roles.user_id, *fields])
    program.slot(("viewer", "id"))   # ("int", 0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from model.features.spec import string_to_id
from pipeline.connectors.avro.schema_fields import SchemaField

__all__ = ["KIND", "Program", "UnsupportedSchema", "compile_program"]

KIND = {
    "null": 0, "boolean": 1, "int": 2, "long": 2, "float": 3, "double": 4, "bytes": 5,
    "string": 6, "fixed": 7, "enum": 8, "record": 9, "array": 10, "map": 11, "union": 12,
}  # fmt: skip
"""Node kinds (the walker's constants are the same numbers)."""
_STORES = ("int", "float", "str", "list", "strs")
_TIME_UNITS = {"timestamp-micros", "local-timestamp-micros", "time-micros"}


class UnsupportedSchema(ValueError):
    """A schema the compiled walker does not take (it decodes with fastavro alone)."""


@dataclass
class Program:
    """A flattened schema and its output slots.

    Attributes:
        kinds / args / counts / slots: int64[nodes]: each node's kind, argument (first child
            in ``children``, or a fixed size), child count, and output slot (-1: none).
        children: int64: node ids, each record's fields and each union's branches in a run.
        enum_ids: per enum node, its symbols' 64-bit ids (``string_to_id``), else ``None``.
        stores: how many slots each store has.
        by_path: a leaf's path -> ``(store, slot, node)``.
        raw_slots: int64[nodes]: each node's raw slot (-1: none).
        raw_by_path: a leaf's path -> its raw slot.
    """

    kinds: list[int] = field(default_factory=list)
    args: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    children: list[int] = field(default_factory=list)
    enum_ids: dict[int, npt.NDArray[np.int64]] = field(default_factory=dict)
    stores: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_STORES, 0))
    by_path: dict[tuple[str, ...], tuple[str, int, int]] = field(default_factory=dict)
    raw_slots: list[int] = field(default_factory=list)
    raw_by_path: dict[tuple[str, ...], int] = field(default_factory=dict)

    def arrays(self) -> tuple[npt.NDArray[np.int64], ...]:
        """``(kinds, args, counts, slots, children, raw_slots)`` as int64 arrays for the
        walker."""
        return tuple(
            np.asarray(a, dtype=np.int64)
            for a in (
                self.kinds, self.args, self.counts, self.slots, self.children or [0],
                self.raw_slots,
            )
        )  # fmt: skip

    def slot(self, path: Sequence[str]) -> tuple[str, int, int]:
        """``(store, slot, node)`` of the leaf at ``path``."""
        return self.by_path[tuple(path)]


class _Compiler:
    def __init__(
        self,
        named: Mapping[str, Any],
        wanted: set[tuple[str, ...]],
        raw: set[tuple[str, ...]],
    ) -> None:
        self.named = named
        self.wanted = wanted
        self.raw = raw
        self.program = Program()
        self._expanding: list[str] = []

    def node(self, schema: Any, path: tuple[str, ...]) -> int:
        """Add ``schema``'s node (and its subtree) at ``path``; returns its id."""
        if isinstance(schema, str) and schema in self.named:
            name = schema
            if name in self._expanding:
                raise UnsupportedSchema(f"recursive type {name}")
            self._expanding.append(name)
            try:
                return self.node(self.named[name], path)
            finally:
                self._expanding.pop()
        p = self.program
        index = len(p.kinds)
        p.kinds.append(0)
        p.args.append(0)
        p.counts.append(0)
        p.slots.append(-1)
        p.raw_slots.append(-1)
        if isinstance(schema, list):
            branches = [self.node(b, path) for b in schema]
            self._children(index, KIND["union"], branches)
            return index
        kind = schema if isinstance(schema, str) else schema["type"]
        if isinstance(kind, (dict, list)):  # {"type": {...}}: the inner type
            p.kinds.pop(), p.args.pop(), p.counts.pop(), p.slots.pop(), p.raw_slots.pop()
            return self.node(kind, path)
        if isinstance(schema, dict) and schema.get("logicalType") in _TIME_UNITS:
            raise UnsupportedSchema(f"{'.'.join(path)}: {schema['logicalType']}")
        if kind == "record":
            fields = [self.node(f["type"], (*path, f["name"])) for f in schema["fields"]]
            self._children(index, KIND["record"], fields)
            return index
        if kind not in KIND:
            raise UnsupportedSchema(f"{'.'.join(path)}: type {kind}")
        p.kinds[index] = KIND[kind]
        if kind == "fixed":
            p.args[index] = int(schema["size"])
        if kind in ("array", "map"):
            item = self.node(schema["items" if kind == "array" else "values"], (*path, "[]"))
            p.args[index] = item
        if kind == "enum":
            p.counts[index] = len(schema["symbols"])
            p.enum_ids[index] = np.array(
                [string_to_id(s) for s in schema["symbols"]], dtype=np.int64
            )
        if path in self.wanted and kind != "null":
            self._assign(index, kind, path)
        if path in self.raw and kind not in ("null", "record", "map"):
            p.raw_slots[index] = len(p.raw_by_path)
            p.raw_by_path[path] = len(p.raw_by_path)
        return index

    def _children(self, index: int, kind: int, nodes: list[int]) -> None:
        p = self.program
        p.kinds[index] = kind
        p.args[index] = len(p.children)
        p.counts[index] = len(nodes)
        p.children.extend(nodes)

    def _assign(self, index: int, kind: str, path: tuple[str, ...]) -> None:
        p = self.program
        if kind in ("long", "int", "boolean", "enum"):
            store = "int"
        elif kind in ("float", "double"):
            store = "float"
        elif kind == "string":
            store = "str"
        elif kind == "array":
            item = p.kinds[p.args[index]]
            if item in (KIND["long"], KIND["enum"], KIND["float"], KIND["double"]):
                store = "list"
            elif item == KIND["string"]:
                store = "strs"
            else:
                raise UnsupportedSchema(f"{'.'.join(path)}: an array of kind {item}")
        else:
            raise UnsupportedSchema(f"{'.'.join(path)}: {kind} is not read")
        p.slots[index] = p.stores[store]
        p.by_path[path] = (store, p.stores[store], index)
        p.stores[store] += 1


def compile_program(
    schema: Mapping[str, Any], fields: Sequence[SchemaField], raw: Sequence[SchemaField] = ()
) -> Program:
    """The program of a parsed record ``schema`` that extracts ``fields`` (their values) and
    ``raw`` (where their Avro encodings lie).

    Raises:
        UnsupportedSchema: a recursive type, a microsecond time, or a leaf of a kind the walker
            does not extract (the caller decodes with fastavro alone).
    """
    compiler = _Compiler(
        schema.get("__named_schemas", {}), {f.path for f in fields}, {f.path for f in raw}
    )
    root = compiler.node(schema, ())
    assert root == 0
    missing = {f.path for f in fields} - set(compiler.program.by_path)
    missing |= {f.path for f in raw} - set(compiler.program.raw_by_path)
    if missing:
        raise UnsupportedSchema(f"fields not reached: {sorted(missing)}")
    return compiler.program
