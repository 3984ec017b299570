"""An output schema of the user's and its role map as a flat *write program* the compiled writer
runs (:mod:`pipeline.connectors.avro.writer`): the mirror image of the decode's program
(:mod:`pipeline.connectors.avro.program`), one encode for a whole batch, no Python object per
event.

The schema's fields are visited in their order once, here; what each one writes becomes an
instruction:

=================  ==========================================================================
instruction        writes
=================  ==========================================================================
``CONST``          bytes known now: a field's default, a union's branch index
role               one value of the event: its id, user id, times, model version, fallback
                   flags, ``retrieved``; or a field of the input event, carried as its Avro
                   bytes (``ECHO``)
``ITEMS`` ...      an array with one entry per kept item (best first): the instructions up to
``END_ITEMS``      ``END_ITEMS`` run once per item (the item id, its ranking score, its task
                   scores, an item record's other fields' defaults)
=================  ==========================================================================

The ranked items are an array of records (the per-item roles name fields of its records:
``ranked.item_id``) or parallel arrays (``item_ids``: an array of longs; ``scores``: an array of
doubles), both as many entries as items kept. Every mistake is one :class:`OutputSchemaError`
line naming the role's key.

Example::

    program = compile_writer(schema, [Binding("output.items", ("ranked", "id"), Role.ITEMS)])
    program.ops    # int64[n, 4]: instruction, then its arguments
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fastavro
import numpy as np
import numpy.typing as npt

from pipeline.connectors.avro.output_roles import (
    MILLIS,
    PER_ITEM,
    Binding,
    OutputSchemaError,
    Role,
    as_dict,
    check_path,
    plain_type,
    same_type,
)
from pipeline.connectors.avro.schema_fields import named_types, resolve_named, type_name

__all__ = ["WriteProgram", "compile_writer", "varint"]

(
    CONST, EVENT_ID, EVENT_ID_LONG, USER_ID, EVENT_TIME, SCORED_AT, MODEL_VERSION,
    FALLBACK_NAMES, FALLBACK_ANY, RETRIEVED, ECHO, ITEMS, END_ITEMS, ITEM_ID, SCORE_F8,
    SCORE_F4, TASK_F8, TASK_F4,
) = range(18)  # fmt: skip
"""Instructions (the writer's constants are these numbers)."""
MAX_VARINT = 10


@dataclass
class WriteProgram:
    """A compiled output schema (see the module docstring).

    Attributes:
        ops: int64[n, 4]: instruction, arguments.
        pool: uint8, the constant bytes ``CONST`` instructions copy.
        fixed_bytes: the most one event writes besides its variable parts (event id, model
            version, echoed bytes) and its items.
        item_bytes: the most one kept item adds (all item arrays together).
        event_id_writes / version_writes: how often the event id / model version is written.
        echo_columns: the raw column of every ``ECHO`` instruction.
        uses: the instructions it holds (:meth:`writes`).
    """

    ops: npt.NDArray[np.int64]
    pool: npt.NDArray[np.uint8]
    fixed_bytes: int
    item_bytes: int
    event_id_writes: int
    version_writes: int
    echo_columns: tuple[int, ...]
    uses: frozenset[int] = field(default_factory=frozenset)

    def writes(self, *instructions: int) -> bool:
        """Whether any of ``instructions`` is in the program."""
        return any(i in self.uses for i in instructions)


def varint(value: int) -> bytes:
    """The zigzag varint of ``value`` (an Avro long or int)."""
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_ROLE_OPS: dict[Role, dict[str, int]] = {
    Role.EVENT_ID: {"string": EVENT_ID},
    Role.USER_ID: {"long": USER_ID},
    Role.ITEMS: {"long": ITEM_ID},
    Role.SCORES: {"double": SCORE_F8, "float": SCORE_F4},
    Role.TASK_SCORE: {"double": TASK_F8, "float": TASK_F4},
    Role.MODEL_VERSION: {"string": MODEL_VERSION},
    Role.SCORED_AT: {"long": SCORED_AT},
    Role.EVENT_TIME: {"long": EVENT_TIME},
    Role.FALLBACK_FEATURES: {"array<string>": FALLBACK_NAMES, "boolean": FALLBACK_ANY},
    Role.RETRIEVED: {"boolean": RETRIEVED},
}
"""Per role: the Avro types it is written as, and the instruction of each."""
_FIXED = {
    EVENT_ID: MAX_VARINT, EVENT_ID_LONG: MAX_VARINT, USER_ID: MAX_VARINT,
    EVENT_TIME: MAX_VARINT, SCORED_AT: MAX_VARINT, MODEL_VERSION: MAX_VARINT,
    FALLBACK_NAMES: 3 * MAX_VARINT + 32, FALLBACK_ANY: 1, RETRIEVED: 1, ECHO: MAX_VARINT,
    ITEMS: MAX_VARINT + 1, ITEM_ID: MAX_VARINT, SCORE_F8: 8, SCORE_F4: 4, TASK_F8: 8, TASK_F4: 4,
}  # fmt: skip
"""The most each instruction writes, its variable part aside."""


class _Compiler:
    def __init__(
        self, schema: Mapping[str, Any], bindings: Sequence[Binding], event_id_long: bool
    ) -> None:
        self.named = named_types(schema)
        self.event_id_long = event_id_long
        self.by_path: dict[tuple[str, ...], Binding] = {}
        for b in bindings:
            other = self.by_path.get(b.path)
            if other is not None:
                raise OutputSchemaError(f"{b.key} = {b.dotted!r}: {other.key} names the same field")
            self.by_path[b.path] = b
        self.ops: list[list[int]] = []
        self.pool = bytearray()
        self.done: set[tuple[str, ...]] = set()
        self.unfilled: list[str] = []
        """Fields no role fills, without a default (told after the roles' own mistakes)."""

    # -- what is written ------------------------------------------------------------------

    def op(self, code: int, a: int = 0, b: int = 0, c: int = 0) -> int:
        self.ops.append([code, a, b, c])
        return len(self.ops) - 1

    def const(self, data: bytes) -> None:
        if not data:
            return
        last = self.ops[-1] if self.ops else None
        if last is not None and last[0] == CONST and last[1] + last[2] == len(self.pool):
            last[2] += len(data)
        else:
            self.op(CONST, len(self.pool), len(data))
        self.pool += data

    def items(self, body: Any) -> None:
        """An array with one entry per kept item, each written by ``body()``."""
        begin = self.op(ITEMS)
        body()
        end = self.op(END_ITEMS, begin + 1)
        self.ops[begin][1] = end

    # -- the schema, field by field ---------------------------------------------------------

    def bound_below(self, path: tuple[str, ...]) -> bool:
        n = len(path)
        return any(p[:n] == path for p in self.by_path)

    def record(self, node: Mapping[str, Any], path: tuple[str, ...], in_items: bool) -> None:
        for f in node["fields"]:
            here = (*path, f["name"])
            if self.bound_below(here):
                self.value(f["type"], here, in_items)
            elif "default" in f:
                self.const(self.default(f["type"], f["default"], here))
            else:
                inner = resolve_named(f["type"], self.named)
                if isinstance(inner, Mapping) and inner.get("type") == "record":
                    self.record(inner, here, in_items)  # its own fields may have defaults
                    continue
                where = "an item record's" if in_items else "the"
                self.unfilled.append(
                    f"output.schema_file: {where} field {'.'.join(here)!r} ({type_name(inner)}) "
                    "has no default and no role of [output] fills it: map a role to it or give "
                    "it a default"
                )

    def value(self, node: Any, path: tuple[str, ...], in_items: bool) -> None:
        """The field at ``path``: bound to a role, or on the way to bound fields."""
        binding = self.by_path.get(path)
        if binding is not None:
            self.bind(binding, node, in_items)
            self.done.add(path)
            return
        node = resolve_named(node, self.named)
        dotted = ".".join(path)
        if isinstance(node, list):  # a union on the way: its one record or array branch
            inner = [
                (i, resolve_named(b, self.named))
                for i, b in enumerate(node)
                if isinstance(resolve_named(b, self.named), Mapping)
                and resolve_named(b, self.named).get("type") in ("record", "array")
            ]
            if len(inner) != 1:
                raise OutputSchemaError(
                    f"output.schema_file: {dotted!r} is a union of {type_name(node)}: a path "
                    "through a union needs exactly one record or array branch"
                )
            self.const(varint(inner[0][0]))
            self.value(inner[0][1], path, in_items)
        elif as_dict(node).get("type") == "record":
            self.record(node, path, in_items)
        elif as_dict(node).get("type") == "array" and not in_items:
            items = resolve_named(node["items"], self.named)
            if not (isinstance(items, Mapping) and items.get("type") == "record"):
                raise OutputSchemaError(
                    f"output.schema_file: {dotted!r} is {type_name(node)}: a path through an "
                    "array needs an array of records"
                )
            self.items(lambda: self.record(items, path, True))
        else:
            raise OutputSchemaError(
                f"output.schema_file: {dotted!r} is {type_name(node)}: a path through it needs "
                "a record (or one array of records, the items)"
            )

    def bind(self, binding: Binding, node: Any, in_items: bool) -> None:
        per_item = binding.role in PER_ITEM
        if per_item and not in_items:  # parallel arrays: an array of the item's type
            branch, array = self.branch(node, lambda n: n.get("type") == "array")
            if array is None:
                raise OutputSchemaError(
                    f"{binding.key} = {binding.dotted!r} is {type_name(node)}: one value per "
                    "item needs an array (an array of longs or doubles, or a path through an "
                    "array of records)"
                )
            self.const(branch)
            self.items(lambda: self.leaf(binding, array["items"]))
            return
        if in_items and not per_item:
            raise OutputSchemaError(
                f"{binding.key} = {binding.dotted!r} is a field of each item; "
                f"{binding.role} is one per event"
            )
        self.leaf(binding, node)

    def branch(self, node: Any, accepts: Any) -> tuple[bytes, Any]:
        """``(union branch index bytes, type)`` of ``node``'s first type ``accepts`` takes
        (``b""`` when ``node`` is no union); ``(b"", None)`` if none."""
        node = resolve_named(node, self.named)
        if isinstance(node, list):
            for i, b in enumerate(node):
                inner = resolve_named(b, self.named)
                if accepts(as_dict(inner)):
                    return varint(i), inner
            return b"", None
        return (b"", node) if accepts(as_dict(node)) else (b"", None)

    def leaf(self, binding: Binding, node: Any) -> None:
        if binding.role is Role.ECHO:
            self.echo(binding, node)
            return
        ops = dict(_ROLE_OPS[binding.role])
        if binding.role is Role.EVENT_ID and self.event_id_long:
            ops["long"] = EVENT_ID_LONG

        def accepts(n: Mapping[str, Any]) -> bool:
            if binding.role in (Role.SCORED_AT, Role.EVENT_TIME) and n.get("logicalType"):
                return n.get("logicalType") in MILLIS and n.get("type") == "long"
            return plain_type(n, self.named) in ops

        branch, chosen = self.branch(node, accepts)
        if chosen is None:
            wanted = " or ".join(sorted(ops))
            if binding.role in (Role.SCORED_AT, Role.EVENT_TIME):
                wanted = "long (epoch milliseconds: no logical type, or timestamp-millis)"
            raise OutputSchemaError(
                f"{binding.key} = {binding.dotted!r} is {type_name(node)}; {binding.role} "
                f"needs {wanted}"
            )
        self.const(branch)
        self.op(ops[plain_type(as_dict(chosen), self.named)], binding.column)

    def echo(self, binding: Binding, node: Any) -> None:
        source = binding.echo
        assert source is not None
        node = resolve_named(node, self.named)
        null = -1
        if isinstance(node, list):
            branches = [resolve_named(b, self.named) for b in node]
            null = branches.index("null") if "null" in branches else -1
            value = next(
                (i for i, b in enumerate(branches) if same_type(b, source, self.named)), -1
            )
        else:
            value = 0 if same_type(node, source, self.named) else -1
        if value < 0:
            raise OutputSchemaError(
                f"{binding.key} = {source.name!r}: the event's field is "
                f"{type_name(source.node)}, the output's {binding.dotted!r} is "
                f"{type_name(node)}; an echoed field keeps its type (an int may become a long, "
                "an enum needs the same symbols in the same order)"
            )
        if source.nullable and null < 0:
            raise OutputSchemaError(
                f"{binding.key} = {source.name!r}: the event's field may be null, the output's "
                f"{binding.dotted!r} may not: make it a union with null"
            )
        self.op(ECHO, source.column, null, value if isinstance(node, list) else -1)

    def default(self, node: Any, value: Any, path: tuple[str, ...]) -> bytes:
        """A field's default, encoded (Avro: a union's default is of its first branch)."""
        wrapper = {"type": "record", "name": "streamrank.Default", "fields": [
            {"name": "v", "type": node},
        ]}  # fmt: skip
        try:
            parsed = fastavro.parse_schema(wrapper, named_schemas=dict(self.named))
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, parsed, {"v": value})
        except Exception as exc:
            raise OutputSchemaError(
                f"output.schema_file: the default of {'.'.join(path)!r} cannot be written: "
                f"{' '.join(str(exc).split())}"
            ) from exc
        return buf.getvalue()


def compile_writer(
    schema: Mapping[str, Any], bindings: Sequence[Binding], event_id_long: bool = False
) -> WriteProgram:
    """The write program of a parsed record ``schema`` with ``bindings``.

    Args:
        schema: ``fastavro.parse_schema`` of the output record schema.
        bindings: every role, each at its field.
        event_id_long: the event's id is a long (an output ``long`` may then hold it).

    Raises:
        OutputSchemaError: a role at a field of another type, a per-item role outside an
            array, a per-event one inside, a field no role fills without a default, a path
            the schema lacks (each message names the role's key, or ``output.schema_file``).
    """
    for b in bindings:
        check_path(schema, b)
    compiler = _Compiler(schema, bindings, event_id_long)
    compiler.record(schema, (), False)
    for b in bindings:
        if b.path not in compiler.done:  # a path inside a field another role fills
            raise OutputSchemaError(
                f"{b.key} = {b.dotted!r} lies inside a field another role fills"
            )
    if compiler.unfilled:
        raise OutputSchemaError(compiler.unfilled[0])
    ops = np.asarray(compiler.ops or [[CONST, 0, 0, 0]], dtype=np.int64).reshape(-1, 4)
    fixed = item = 0
    depth = 0
    for code, _, length, _ in ops.tolist():
        size = length if code == CONST else _FIXED.get(code, 0)
        if code == END_ITEMS:
            depth -= 1
        elif depth:
            item += size
        else:
            fixed += size
        if code == ITEMS:
            depth += 1
    codes = ops[:, 0].tolist()
    return WriteProgram(
        ops=ops,
        pool=np.frombuffer(bytes(compiler.pool) or b"\0", dtype=np.uint8).copy(),
        fixed_bytes=fixed,
        item_bytes=item,
        event_id_writes=codes.count(EVENT_ID),
        version_writes=codes.count(MODEL_VERSION),
        echo_columns=tuple(int(a) for c, a, _, _ in ops.tolist() if c == ECHO),
        uses=frozenset(codes),
    )
