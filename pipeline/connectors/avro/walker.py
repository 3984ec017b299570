"""The compiled walker: many message bodies of any record schema, one pass, slots filled.

It interprets a :class:`~pipeline.connectors.avro.program.Program` (the schema flattened into
node arrays) with an explicit stack, over every body of a poll laid end to end in one ``uint8``
buffer, and writes the program's slots (:mod:`pipeline.connectors.avro.program`) into numpy
arrays: no Python object per event. A body that does not decode, or leaves bytes over, gets
``STATUS_UNDECODABLE`` (its partial output is discarded); the decode stage asks fastavro about
those.

Example::

    outputs = WalkOutputs.allocate(program, len(starts), len(buf))
    walk(buf, starts, ends, status, program, outputs)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from model.kernels import kernel
from pipeline.connectors.avro.kernels import _string, _varint
from pipeline.connectors.avro.program import Program
from pipeline.connectors.avro.rules import STATUS_OK, STATUS_UNDECODABLE

__all__ = ["WalkOutputs", "walk"]

_NULL, _BOOLEAN, _LONG, _FLOAT, _DOUBLE, _BYTES, _STRING, _FIXED = 0, 1, 2, 3, 4, 5, 6, 7
_ENUM, _RECORD, _ARRAY, _MAP, _UNION = 8, 9, 10, 11, 12
_DEPTH = 128
"""Nesting the walker follows (records, arrays, unions): deeper bodies are undecodable."""
_MAX_NULL_ITEMS = 1 << 20
"""Items of zero bytes (nulls) an array block may claim."""

I64 = npt.NDArray[np.int64]


@dataclass
class WalkOutputs:
    """What the walker writes, per message ``m`` (see the program's stores).

    Attributes:
        ints / floats: ``[M, slots]`` values; ``*_present``: ``[M, slots]`` 1 where reached.
        strs: ``[M, 3 * slots]``: each string's start in the buffer, bytes and characters.
        list_start / list_count: ``[M, slots]``: each id list's items in ``list_values``;
            ``list_present``: 1 where the list was reached (0: null, or in a null record).
        list_values: the id lists' items, flat (``n_values`` of them written); a float list's
            items as the bits of their float64 value (``list_values.view(np.float64)``).
        strs_start / strs_count / strs_present: ``[M, slots]``: each string list's items in
            ``strs_items``, and where it was reached.
        strs_items: ``[items, 3]``: start, bytes and characters of each string-list item.
        raw_span: ``[M, 2 * raw slots]``: where each raw leaf's encoding starts and ends in
            the buffer; ``raw_present``: ``[M, raw slots]`` 1 where reached.
    """

    ints: I64
    int_present: npt.NDArray[np.uint8]
    floats: npt.NDArray[np.float64]
    float_present: npt.NDArray[np.uint8]
    strs: I64
    str_present: npt.NDArray[np.uint8]
    list_start: I64
    list_count: I64
    list_present: npt.NDArray[np.uint8]
    list_values: I64
    strs_start: I64
    strs_count: I64
    strs_present: npt.NDArray[np.uint8]
    strs_items: I64
    raw_span: I64
    raw_present: npt.NDArray[np.uint8]

    @classmethod
    def allocate(cls, program: Program, messages: int, buffer_bytes: int) -> WalkOutputs:
        """Outputs for ``messages`` bodies of ``buffer_bytes`` in all (each list item takes a
        byte at least, so the flat arrays cannot overflow)."""
        n, s, r = messages, program.stores, len(program.raw_by_path)
        return cls(
            np.zeros((n, s["int"]), dtype=np.int64),
            np.zeros((n, s["int"]), dtype=np.uint8),
            np.zeros((n, s["float"]), dtype=np.float64),
            np.zeros((n, s["float"]), dtype=np.uint8),
            np.zeros((n, 3 * s["str"]), dtype=np.int64),
            np.zeros((n, s["str"]), dtype=np.uint8),
            np.zeros((n, s["list"]), dtype=np.int64),
            np.zeros((n, s["list"]), dtype=np.int64),
            np.zeros((n, s["list"]), dtype=np.uint8),
            np.empty(buffer_bytes if s["list"] else 0, dtype=np.int64),
            np.zeros((n, s["strs"]), dtype=np.int64),
            np.zeros((n, s["strs"]), dtype=np.int64),
            np.zeros((n, s["strs"]), dtype=np.uint8),
            np.empty((buffer_bytes if s["strs"] else 0, 3), dtype=np.int64),
            np.zeros((n, 2 * r), dtype=np.int64),
            np.zeros((n, r), dtype=np.uint8),
        )


def walk(
    buf: npt.NDArray[np.uint8],
    starts: I64,
    ends: I64,
    status: npt.NDArray[np.int8],
    program: Program,
    out: WalkOutputs,
) -> None:
    """Walk every body ``buf[starts[m]:ends[m]]`` whose ``status`` is OK (module docstring)."""
    kinds, args, counts, slots, children, raw_slots = program.arrays()
    _walk(
        buf, starts, ends, status, kinds, args, counts, slots, children, raw_slots,
        out.ints, out.int_present, out.floats, out.float_present, out.strs, out.str_present,
        out.list_start, out.list_count, out.list_present, out.list_values, out.strs_start,
        out.strs_count, out.strs_present, out.strs_items, out.raw_span, out.raw_present,
    )  # fmt: skip


@kernel
def _chars(buf: npt.NDArray[np.uint8], start: int, length: int) -> int:
    """Characters of valid UTF-8: the bytes that are not continuation bytes."""
    n = 0
    for i in range(start, start + length):
        n += (buf[i] & 0xC0) != 0x80
    return n


@kernel
def _walk(
    buf: npt.NDArray[np.uint8],
    starts: I64,
    ends: I64,
    status: npt.NDArray[np.int8],
    kinds: I64,
    args: I64,
    counts: I64,
    slots: I64,
    children: I64,
    raw_slots: I64,
    ints: I64,
    int_present: npt.NDArray[np.uint8],
    floats: npt.NDArray[np.float64],
    float_present: npt.NDArray[np.uint8],
    strs: I64,
    str_present: npt.NDArray[np.uint8],
    list_start: I64,
    list_count: I64,
    list_present: npt.NDArray[np.uint8],
    list_values: I64,
    strs_start: I64,
    strs_count: I64,
    strs_present: npt.NDArray[np.uint8],
    strs_items: I64,
    raw_span: I64,
    raw_present: npt.NDArray[np.uint8],
) -> None:
    stack = np.zeros(_DEPTH, dtype=np.int64)
    step = np.zeros(_DEPTH, dtype=np.int64)
    left = np.zeros(_DEPTH, dtype=np.int64)
    real = np.zeros(1, dtype=np.float64)  # a float list item, read as its float64 bits
    nv = 0
    ni = 0
    for m in range(len(starts)):
        if status[m] != STATUS_OK:
            continue
        pos, end = starts[m], ends[m]
        nv0, ni0 = nv, ni
        sp = 1
        stack[0], step[0], left[0] = 0, 0, 0
        ok = True
        while sp > 0 and ok:
            node = stack[sp - 1]
            kind = kinds[node]
            if kind == _RECORD:
                i = step[sp - 1]
                if i == counts[node]:
                    sp -= 1
                elif sp == _DEPTH:
                    ok = False
                else:
                    step[sp - 1] = i + 1
                    stack[sp], step[sp], left[sp] = children[args[node] + i], 0, 0
                    sp += 1
                continue
            if kind == _UNION:
                branch, pos = _varint(buf, pos, end)
                if pos < 0 or branch < 0 or branch >= counts[node]:
                    ok = False
                else:
                    stack[sp - 1], step[sp - 1], left[sp - 1] = children[args[node] + branch], 0, 0
                continue
            if kind in (_ARRAY, _MAP):
                slot = slots[node]
                item = args[node]
                if left[sp - 1] == 0:
                    if step[sp - 1] == 0:
                        if slot >= 0:  # an extracted list starts here
                            if kinds[item] == _STRING:
                                strs_start[m, slot] = ni
                                strs_present[m, slot] = 1
                            else:
                                list_start[m, slot] = nv
                                list_present[m, slot] = 1
                        if raw_slots[node] >= 0:  # a raw array starts here
                            raw_span[m, 2 * raw_slots[node]] = pos
                    step[sp - 1] = 1
                    block, pos = _varint(buf, pos, end)
                    if pos < 0:
                        ok = False
                        continue
                    if block == 0:
                        sp -= 1
                        if raw_slots[node] >= 0:
                            raw_span[m, 2 * raw_slots[node] + 1] = pos
                            raw_present[m, raw_slots[node]] = 1
                        continue
                    if block < 0:
                        block = -block
                        _, pos = _varint(buf, pos, end)
                        if pos < 0:
                            ok = False
                            continue
                    if block > end - pos and (kinds[item] != _NULL or block > _MAX_NULL_ITEMS):
                        ok = False
                        continue
                    left[sp - 1] = block
                left[sp - 1] -= 1
                if kind == _MAP:
                    _, _, pos = _string(buf, pos, end)
                    if pos < 0:
                        ok = False
                        continue
                if slot >= 0:  # an item of an extracted list: read here
                    if kinds[item] == _STRING:
                        start, length, pos = _string(buf, pos, end)
                        if pos < 0:
                            ok = False
                            continue
                        strs_items[ni, 0], strs_items[ni, 1] = start, length
                        strs_items[ni, 2] = _chars(buf, start, length)
                        ni += 1
                        strs_count[m, slot] += 1
                    elif kinds[item] == _FLOAT or kinds[item] == _DOUBLE:
                        size = 4 if kinds[item] == _FLOAT else 8
                        if pos + size > end:
                            ok = False
                            continue
                        if size == 4:
                            real[0] = buf[pos : pos + 4].view(np.float32)[0]
                        else:
                            real[0] = buf[pos : pos + 8].view(np.float64)[0]
                        pos += size
                        list_values[nv] = real.view(np.int64)[0]
                        nv += 1
                        list_count[m, slot] += 1
                    else:
                        value, pos = _varint(buf, pos, end)
                        if pos < 0 or (kinds[item] == _ENUM and not 0 <= value < counts[item]):
                            ok = False
                            continue
                        list_values[nv] = value
                        nv += 1
                        list_count[m, slot] += 1
                elif sp == _DEPTH:
                    ok = False
                else:
                    stack[sp], step[sp], left[sp] = item, 0, 0
                    sp += 1
                continue
            slot = slots[node]
            raw = raw_slots[node]
            at = pos
            sp -= 1
            if kind == _NULL:
                continue
            if kind == _BOOLEAN:
                if pos >= end or buf[pos] > 1:
                    ok = False
                    continue
                value = int(buf[pos])
                pos += 1
            elif kind in (_LONG, _ENUM):
                value, pos = _varint(buf, pos, end)
                if pos < 0 or (kind == _ENUM and not 0 <= value < counts[node]):
                    ok = False
                    continue
            elif kind in (_FLOAT, _DOUBLE):
                size = 4 if kind == _FLOAT else 8
                if pos + size > end:
                    ok = False
                    continue
                if slot >= 0:
                    if kind == _FLOAT:
                        floats[m, slot] = buf[pos : pos + 4].view(np.float32)[0]
                    else:
                        floats[m, slot] = buf[pos : pos + 8].view(np.float64)[0]
                    float_present[m, slot] = 1
                pos += size
                if raw >= 0:
                    raw_span[m, 2 * raw], raw_span[m, 2 * raw + 1] = at, pos
                    raw_present[m, raw] = 1
                continue
            elif kind == _STRING:
                start, length, pos = _string(buf, pos, end)
                if pos < 0:
                    ok = False
                    continue
                if slot >= 0:
                    strs[m, 3 * slot], strs[m, 3 * slot + 1] = start, length
                    strs[m, 3 * slot + 2] = _chars(buf, start, length)
                    str_present[m, slot] = 1
                if raw >= 0:
                    raw_span[m, 2 * raw], raw_span[m, 2 * raw + 1] = at, pos
                    raw_present[m, raw] = 1
                continue
            elif kind == _BYTES:
                length, pos = _varint(buf, pos, end)
                if pos < 0 or length < 0 or pos + length > end:
                    ok = False
                    continue
                pos += length
                continue
            else:  # fixed
                if pos + args[node] > end:
                    ok = False
                    continue
                pos += args[node]
                continue
            if slot >= 0:
                ints[m, slot] = value
                int_present[m, slot] = 1
            if raw >= 0:
                raw_span[m, 2 * raw], raw_span[m, 2 * raw + 1] = at, pos
                raw_present[m, raw] = 1
        if not ok or pos != end:
            status[m] = STATUS_UNDECODABLE
            nv, ni = nv0, ni0
