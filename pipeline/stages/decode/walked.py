"""The compiled walk's slots -> events as columns, and the rules checked over whole columns.

:class:`WalkedColumns` turns :class:`~pipeline.connectors.avro.walker.WalkOutputs` of the walked
messages into :class:`~pipeline.types.EventColumns` (roles) with their
:class:`~pipeline.types.FieldColumns` (the feature map's event fields): strings hashed once per
distinct value, enums through their symbols' ids, lists cut to ``max_ids``; and flags, per
event, every one that breaks a rule of :class:`~pipeline.stages.decode.records.RecordDecoder`
(which then tells the reason). A weighted key's list brings its weights (a float array of the
same length; another length, or a weight that is not finite, breaks a rule). numpy over
columns, no Python object per event.

Example::

    events, bad = WalkedColumns(program, fmap, limits).columns(buf, outputs, rows)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from model.features.mapping import EventField, FeatureMap, Store
from model.features.segments import offsets, positions
from model.features.spec import string_to_id
from model.kernels import kernel
from pipeline.connectors.avro.kernels import _fnv1a
from pipeline.connectors.avro.program import Program
from pipeline.connectors.avro.rules import EARLIEST_EVENT_MS, Limits
from pipeline.connectors.avro.schema_fields import FieldKind, SchemaField
from pipeline.connectors.avro.walker import WalkOutputs
from pipeline.settings.features import OutOfRange, Source, Transform
from pipeline.types import EventColumns, FieldColumns

__all__ = ["WalkedColumns"]

I64 = npt.NDArray[np.int64]
Flags = npt.NDArray[np.bool_]
A = TypeVar("A", np.int64, np.float32)
_CACHE = 100_000
"""Distinct strings whose 64-bit id is remembered (cleared when full)."""


@kernel
def _keys(buf: npt.NDArray[np.uint8], starts: I64, lengths: I64) -> I64:
    out = np.empty(len(starts), dtype=np.int64)
    for i in range(len(starts)):
        out[i] = _fnv1a(buf, starts[i], lengths[i])
    return out


class WalkedColumns:
    """Columns and rule flags of walked messages (see the module docstring).

    Args:
        program: the compiled schema (its slots).
        fmap: the feature map (roles, event fields, ``dlq`` id checks).
        limits: the ``[codec]`` limits.
    """

    def __init__(self, program: Program, fmap: FeatureMap, limits: Limits) -> None:
        self._program = program
        self._fmap = fmap
        self._limits = limits
        self._strings: dict[int, int] = {}
        # Load (or compile) it now, for the arrays messages give (a read-only buffer).
        empty = np.zeros(0, dtype=np.int64)
        _keys(np.frombuffer(b"\0", dtype=np.uint8), empty, empty)

    def columns(
        self, buf: npt.NDArray[np.uint8], out: WalkOutputs, rows: I64
    ) -> tuple[EventColumns, Flags]:
        """The events of messages ``rows`` and, per event, whether it breaks a rule."""
        self._buf, self._out, self._rows = buf, out, rows
        roles, limits, n = self._fmap.roles, self._limits, len(rows)
        user_ids, _ = self._ints(roles.user_id)
        times, _ = self._ints(roles.event_time)
        counts, candidates, _ = self._list(roles.candidates, None)
        num_results = np.full(n, roles.num_results_default, dtype=np.int64)
        if roles.num_results is not None:
            value, present = self._ints(roles.num_results)
            num_results = np.where(present, value, num_results)
        id_bytes, id_offsets, id_chars = self._event_ids(roles.event_id)
        bad = (counts > limits.max_candidates) | ((counts == 0) & (not limits.retrieve))
        bad |= (user_ids < 0) | (user_ids > limits.max_id)
        bad |= _any((candidates < 0) | (candidates > limits.max_id), counts)
        bad |= (num_results < 1) | (num_results > limits.max_num_results)
        bad |= (id_chars < 1) | (id_chars > limits.max_string_length)
        bad |= (times < EARLIEST_EVENT_MS) | (times > limits.latest_event_ms())
        fields = self._fields(bad)
        self._check_ranges(fields, counts, candidates, bad)
        zeros = np.zeros(n, dtype=np.int64)
        events = EventColumns(
            event_id_bytes=id_bytes,
            event_id_offsets=id_offsets,
            user_ids=user_ids,
            event_time_ms=times,
            device_ids=zeros,
            country_ids=zeros.copy(),
            num_results=num_results,
            candidate_counts=counts,
            candidate_ids=candidates,
            recent_counts=zeros.copy(),
            recent_ids=np.zeros(0, dtype=np.int64),
            retrieved=np.zeros(n, dtype=bool),
            fields=fields,
        )
        return events, bad

    def _ints(self, field: SchemaField) -> tuple[I64, Flags]:
        """A scalar int slot's values (an enum's symbol ids) and where present."""
        _, slot, node = self._program.slot(field.path)
        values = self._out.ints[self._rows, slot]
        symbols = self._program.enum_ids.get(node)
        if symbols is not None:
            values = symbols[values]
        return values, self._out.int_present[self._rows, slot].astype(bool)

    def _string_ids(self, starts: I64, lengths: I64) -> I64:
        """``string_to_id`` of the strings at ``starts``, hashed once per distinct value."""
        c = np.ascontiguousarray  # one specialization of the kernel, not one per layout
        keys = _keys(self._buf, c(starts), c(lengths))
        unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        ids = np.empty(len(unique), dtype=np.int64)
        data = self._buf.tobytes() if len(unique) else b""
        for u, (key, at) in enumerate(zip(unique.tolist(), first.tolist(), strict=True)):
            found = self._strings.get(key)
            if found is None:
                if len(self._strings) >= _CACHE:
                    self._strings.clear()
                s, n = int(starts[at]), int(lengths[at])
                found = self._strings[key] = string_to_id(data[s : s + n].decode())
            ids[u] = found
        return ids[inverse.reshape(-1)]

    def _strings_of(self, field: SchemaField) -> tuple[I64, Flags, Flags]:
        """A string slot's ids, where present, and where its length breaks the rule."""
        _, slot, _ = self._program.slot(field.path)
        strs = self._out.strs[self._rows]
        present = self._out.str_present[self._rows, slot].astype(bool)
        chars = strs[:, 3 * slot + 2]
        ids = self._string_ids(strs[:, 3 * slot], strs[:, 3 * slot + 1])
        return ids, present, present & ((chars < 1) | (chars > self._limits.max_string_length))

    def _event_ids(self, field: SchemaField) -> tuple[npt.NDArray[np.uint8], I64, I64]:
        """The event ids' bytes back to back, their offsets and character counts."""
        store, slot, _ = self._program.slot(field.path)
        if store == "str":
            strs = self._out.strs[self._rows]
            starts, lengths = strs[:, 3 * slot], strs[:, 3 * slot + 1]
            data = self._buf[np.repeat(starts, lengths) + positions(lengths)]
            return data, offsets(lengths), strs[:, 3 * slot + 2]
        texts = [str(v).encode() for v in self._out.ints[self._rows, slot].tolist()]
        lengths = np.fromiter(map(len, texts), np.int64, len(texts))
        return np.frombuffer(b"".join(texts), dtype=np.uint8).copy(), offsets(lengths), lengths

    def _list(self, field: SchemaField, cap: int | None) -> tuple[I64, I64, Flags]:
        """An id list's counts (cut to ``cap``), items, event-major (enums: symbol ids), and
        where it is present (not null)."""
        _, slot, node = self._program.slot(field.path)
        counts = self._out.list_count[self._rows, slot]
        kept = counts if cap is None else np.minimum(counts, cap)
        index = np.repeat(self._out.list_start[self._rows, slot], kept) + positions(kept)
        values = self._out.list_values[index]
        symbols = self._program.enum_ids.get(int(self._program.args[node]))
        present = self._out.list_present[self._rows, slot].astype(bool)
        return kept, values if symbols is None else symbols[values], present

    def _string_list(self, field: SchemaField, cap: int) -> tuple[I64, I64, Flags, Flags]:
        """A string list's counts (cut to ``cap``), item ids, where it is present, and where an
        item breaks the length rule."""
        _, slot, _ = self._program.slot(field.path)
        kept = np.minimum(self._out.strs_count[self._rows, slot], cap)
        index = np.repeat(self._out.strs_start[self._rows, slot], kept) + positions(kept)
        items = self._out.strs_items[index]
        chars = items[:, 2]
        ids = self._string_ids(items[:, 0], items[:, 1])
        long = (chars < 1) | (chars > self._limits.max_string_length)
        present = self._out.strs_present[self._rows, slot].astype(bool)
        return kept, ids, present, _any(long, kept)

    def _raw(self, fields: FieldColumns) -> None:
        """The raw event fields: each one's Avro bytes as written, entity-major."""
        raw = [f for f in self._fmap.event_fields if f.store is Store.RAW]
        if not raw:
            return
        at = np.zeros(fields.raw_counts.shape, dtype=np.int64)
        span = self._out.raw_span[self._rows]
        for f in raw:
            slot = self._program.raw_by_path[f.field.path]
            present = self._out.raw_present[self._rows, slot]
            at[:, f.column] = span[:, 2 * slot]
            fields.raw_counts[:, f.column] = (span[:, 2 * slot + 1] - span[:, 2 * slot]) * present
            fields.raw_present[:, f.column] = present
        counts = fields.raw_counts.reshape(-1)
        fields.raw_bytes = self._buf[np.repeat(at.reshape(-1), counts) + positions(counts)]

    def _fields(self, bad: Flags) -> FieldColumns:
        """The feature map's event fields (``bad`` gains string-length breaks)."""
        fmap, n = self._fmap, len(self._rows)
        fields = FieldColumns.empty(
            n, fmap.event_count(Store.INTS), fmap.event_count(Store.FLOATS),
            fmap.event_count(Store.LISTS), fmap.event_count(Store.RAW),
        )  # fmt: skip
        self._raw(fields)
        lists: list[I64] = []
        weights: list[npt.NDArray[np.float32]] = []
        weighted = any(f.weights is not None for f in fmap.event_fields)
        for f in fmap.event_fields:
            if f.store is Store.RAW:
                continue
            kind, store = f.field.kind, self._program.slot(f.field.path)[0]
            if f.store is Store.FLOATS:
                if store == "float":
                    _, slot, _ = self._program.slot(f.field.path)
                    values = self._out.floats[self._rows, slot]
                    present = self._out.float_present[self._rows, slot].astype(bool)
                else:
                    ints, present = self._ints(f.field)
                    values = ints.astype(np.float64)
                fields.floats[:, f.column] = np.where(present, values, np.nan)
                continue
            if kind is FieldKind.STRING_LIST:
                counts, ids, present, long = self._string_list(f.field, f.max_ids)
                bad |= long
            elif kind is FieldKind.INT_LIST:
                counts, ids, present = self._list(f.field, f.max_ids)
            else:
                if store == "str":
                    ids, present, long = self._strings_of(f.field)
                    bad |= long
                else:
                    ids, present = self._ints(f.field)
                if f.store is Store.INTS:
                    fields.ints[:, f.column] = ids
                    fields.int_present[:, f.column] = present
                    continue
                counts, ids = present.astype(np.int64), ids[present]
            fields.list_counts[:, f.column] = counts
            fields.list_present[:, f.column] = present
            lists.append(ids)
            if weighted:
                weights.append(self._weights(f, counts, present, bad))
        fields.list_ids = _interleave(fields.list_counts, lists)
        if weighted:
            fields.list_weights = _interleave(fields.list_counts, weights)
        return fields

    def _weights(
        self, f: EventField, kept: I64, present: Flags, bad: Flags
    ) -> npt.NDArray[np.float32]:
        """The weights of list ``f``'s ``kept`` ids (1.0 without ``f.weights``); ``bad`` gains
        the events whose weights are not one per id (a null array counts none), or not finite."""
        if f.weights is None:
            return np.ones(int(kept.sum()), dtype=np.float32)
        store, slot, _ = self._program.slot(f.field.path)
        ids = (self._out.strs_count if store == "strs" else self._out.list_count)[self._rows, slot]
        _, wslot, _ = self._program.slot(f.weights.path)
        have = self._out.list_count[self._rows, wslot]
        bad |= present & (ids != have)
        index = np.repeat(self._out.list_start[self._rows, wslot], kept) + positions(kept)
        readable = np.repeat(have >= kept, kept)  # the others are flagged: never read past
        values = np.full(len(index), np.nan, dtype=np.float32)
        with np.errstate(over="ignore"):  # a double beyond float32: inf, flagged below
            values[readable] = self._out.list_values[index[readable]].view(np.float64)
        bad |= _any(~np.isfinite(values), kept)
        return values

    def _check_ranges(self, fields: FieldColumns, counts: I64, candidates: I64, bad: Flags) -> None:
        """Flag events with an id outside an ``identity`` table configured to dead-letter."""
        for key in self._fmap.sparse:
            if key.transform is not Transform.IDENTITY or key.out_of_range is not OutOfRange.DLQ:
                continue
            if key.source is Source.CANDIDATE:
                values, per_event = candidates, counts
            elif key.store is Store.INTS:
                values, per_event = fields.ints[:, key.column], np.ones(len(counts), np.int64)
            else:
                per_event = fields.list_counts[:, key.column]
                starts = fields.list_starts(key.column)
                index = np.repeat(starts, per_event) + positions(per_event)
                values = fields.list_ids[index]
            bad |= _any((values < 0) | (values >= key.num_rows), per_event)


def _any(flags: Flags, counts: I64) -> Flags:
    """Per segment (``counts`` items each, back to back): whether any flag is set."""
    total = np.concatenate(([0], np.cumsum(flags, dtype=np.int64)))
    ends = np.cumsum(counts)
    return (total[ends] - total[ends - counts]) > 0


def _interleave(counts: I64, lists: Sequence[npt.NDArray[A]]) -> npt.NDArray[A]:
    """Lists given one by one (each event-major) -> entity-major, an entity's lists in order
    (ids, or their weights)."""
    if not lists:
        return np.zeros(0, dtype=np.int64)
    out = np.empty(int(counts.sum()), dtype=lists[0].dtype)
    first = offsets(counts.sum(axis=1))[:-1]
    before = np.concatenate([np.zeros((len(counts), 1), np.int64), np.cumsum(counts, axis=1)], 1)
    for j, values in enumerate(lists):
        c = counts[:, j]
        out[np.repeat(first + before[:, j], c) + positions(c)] = values
    return out
