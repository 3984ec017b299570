"""The compiled writer: a batch's records of any output schema, one pass, no Python object per
event.

It runs a :class:`~pipeline.connectors.avro.write_program.WriteProgram` (the output schema and
its role map, flattened into instructions) for every event of a batch, over the batch's
columns: the events' ids, user ids and times, their kept items (flat, event-major, best first)
with their ranking and task scores, the fallback flags, and the input fields carried through
as the Avro bytes they were written with. The records land back to back in one ``uint8``
buffer; record ``e`` is ``out[out_offsets[e]:out_offsets[e + 1]]``.

Example::

    out, out_offsets = write_records(program, OutputColumns(header, event_ids, ...))
    records = [out[a:b].tobytes() for a, b in itertools.pairwise(out_offsets)]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from model.kernels import kernel
from pipeline.connectors.avro.kernels import _put_bytes, _put_long, put_fallbacks
from pipeline.connectors.avro.write_program import (
    CONST,
    ECHO,
    END_ITEMS,
    EVENT_ID,
    EVENT_ID_LONG,
    EVENT_TIME,
    FALLBACK_ANY,
    FALLBACK_NAMES,
    ITEM_ID,
    ITEMS,
    MODEL_VERSION,
    RETRIEVED,
    SCORE_F4,
    SCORE_F8,
    SCORED_AT,
    TASK_F4,
    TASK_F8,
    USER_ID,
    WriteProgram,
)

__all__ = ["OutputColumns", "write_records"]

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]
Flags = npt.NDArray[np.bool_]


@dataclass
class OutputColumns:
    """What one batch's records are written from (``E`` events, ``K`` kept items).

    Attributes:
        header: written before each record (the Confluent header, or nothing).
        event_ids / event_id_offsets: UTF-8 event ids, event ``e`` at
            ``[offsets[e], offsets[e + 1])`` (decimal text for a long id).
        user_ids / event_time_ms: int64[E].
        retrieved: bool[E].
        item_counts: int64[E] each event's kept items (back to back in the flat arrays).
        item_ids: int64[K], best first within each event.
        scores8 / scores4: the float64[K] / float32[K] ranking scores as little-endian bytes
            (empty when the program writes none of that width).
        tasks8 / tasks4: the ``[K, P]`` task scores as bytes, likewise; ``tasks``: ``P``.
        model_version: UTF-8 bytes.
        scored_at: epoch milliseconds.
        fallback_user / fallback_item: bool[E].
        names / name_offsets: the two fallback names (user, item), UTF-8.
        raw_bytes / raw_counts / raw_present: the events' carried fields, event-major, an
            event's columns one after another: column ``c`` of event ``e`` is
            ``raw_counts[e, c]`` bytes, null where ``raw_present[e, c]`` is 0.
    """

    header: U8
    event_ids: U8
    event_id_offsets: I64
    user_ids: I64
    event_time_ms: I64
    retrieved: Flags
    item_counts: I64
    item_ids: I64
    scores8: U8
    scores4: U8
    tasks8: U8
    tasks4: U8
    tasks: int
    model_version: U8
    scored_at: int
    fallback_user: Flags
    fallback_item: Flags
    names: U8
    name_offsets: I64
    raw_bytes: U8
    raw_counts: I64
    raw_present: npt.NDArray[np.uint8]

    def capacity(self, program: WriteProgram) -> int:
        """Bytes enough for every record of the batch."""
        events, kept = len(self.user_ids), len(self.item_ids)
        size = events * (len(self.header) + program.fixed_bytes) + kept * program.item_bytes
        size += program.event_id_writes * len(self.event_ids)
        size += program.version_writes * events * len(self.model_version)
        size += len(program.echo_columns) * len(self.raw_bytes)
        return size + 16


def write_records(program: WriteProgram, columns: OutputColumns) -> tuple[U8, I64]:
    """Every event's record, back to back (one compiled call).

    Returns:
        ``(out, out_offsets)``: the bytes, and int64[E + 1] where each record starts (then the
        end).
    """
    c = columns
    out = np.empty(c.capacity(program), dtype=np.uint8)
    out_offsets = np.empty(len(c.user_ids) + 1, dtype=np.int64)
    _write(
        program.ops, program.pool, c.header, c.event_ids, c.event_id_offsets, c.user_ids,
        c.event_time_ms, c.retrieved, c.item_counts, c.item_ids, c.scores8, c.scores4, c.tasks8,
        c.tasks4, c.tasks, c.model_version, c.scored_at, c.fallback_user, c.fallback_item,
        c.names, c.name_offsets, c.raw_bytes, c.raw_counts, c.raw_present, out, out_offsets,
    )  # fmt: skip
    return out, out_offsets


@kernel
def _decimal(data: U8, start: int, end: int) -> int:
    """The long written as decimal text in ``data[start:end]`` (an event id that was a long)."""
    value = 0
    negative = False
    for i in range(start, end):
        if data[i] == 45:  # "-"
            negative = True
        else:
            value = value * 10 + int(data[i]) - 48
    return -value if negative else value


@kernel(inline="always")
def _copy(out: U8, pos: int, data: U8, start: int, length: int) -> int:
    """``data[start:start + length]`` to ``out[pos:]`` (a few bytes: no slices made)."""
    for k in range(length):
        out[pos + k] = data[start + k]
    return pos + length


@kernel
def _write(
    ops: I64,
    pool: U8,
    header: U8,
    event_ids: U8,
    event_id_offsets: I64,
    user_ids: I64,
    event_time_ms: I64,
    retrieved: Flags,
    item_counts: I64,
    item_ids: I64,
    scores8: U8,
    scores4: U8,
    tasks8: U8,
    tasks4: U8,
    tasks: int,
    model_version: U8,
    scored_at: int,
    fallback_user: Flags,
    fallback_item: Flags,
    names: U8,
    name_offsets: I64,
    raw_bytes: U8,
    raw_counts: I64,
    raw_present: npt.NDArray[np.uint8],
    out: U8,
    out_offsets: I64,
) -> None:
    pos = 0
    n_ops = len(ops)
    first = 0  # the event's first item in the flat arrays
    raw_at = 0  # the event's first raw byte
    for e in range(len(user_ids)):
        out_offsets[e] = pos
        for k in range(len(header)):
            out[pos + k] = header[k]
        pos += len(header)
        item = item_end = 0
        pc = 0
        while pc < n_ops:
            op = ops[pc, 0]
            if op == CONST:
                start, length = ops[pc, 1], ops[pc, 2]
                for k in range(length):
                    out[pos + k] = pool[start + k]
                pos += length
            elif op == ITEMS:
                item, item_end = first, first + item_counts[e]
                if item_end == item:
                    out[pos] = 0  # an empty array
                    pos += 1
                    pc = ops[pc, 1] + 1  # past its END_ITEMS
                    continue
                pos = _put_long(out, pos, item_end - item)
            elif op == END_ITEMS:
                item += 1
                if item < item_end:
                    pc = ops[pc, 1]  # the next item
                    continue
                out[pos] = 0  # end of the array
                pos += 1
            elif op == ITEM_ID:
                pos = _put_long(out, pos, item_ids[item])
            elif op == SCORE_F8:
                pos = _copy(out, pos, scores8, 8 * item, 8)
            elif op == SCORE_F4:
                pos = _copy(out, pos, scores4, 4 * item, 4)
            elif op == TASK_F8:
                pos = _copy(out, pos, tasks8, 8 * (item * tasks + ops[pc, 1]), 8)
            elif op == TASK_F4:
                pos = _copy(out, pos, tasks4, 4 * (item * tasks + ops[pc, 1]), 4)
            elif op == EVENT_ID:
                pos = _put_bytes(out, pos, event_ids, event_id_offsets[e], event_id_offsets[e + 1])
            elif op == EVENT_ID_LONG:
                value = _decimal(event_ids, event_id_offsets[e], event_id_offsets[e + 1])
                pos = _put_long(out, pos, value)
            elif op == USER_ID:
                pos = _put_long(out, pos, user_ids[e])
            elif op == EVENT_TIME:
                pos = _put_long(out, pos, event_time_ms[e])
            elif op == SCORED_AT:
                pos = _put_long(out, pos, scored_at)
            elif op == MODEL_VERSION:
                pos = _put_bytes(out, pos, model_version, 0, len(model_version))
            elif op == FALLBACK_NAMES:
                user, item_fb = fallback_user[e], fallback_item[e]
                pos = put_fallbacks(out, pos, user, item_fb, names, name_offsets)
            elif op == FALLBACK_ANY:
                out[pos] = 1 if fallback_user[e] or fallback_item[e] else 0
                pos += 1
            elif op == RETRIEVED:
                out[pos] = 1 if retrieved[e] else 0
                pos += 1
            elif op == ECHO:
                column = ops[pc, 1]
                if raw_present[e, column]:
                    if ops[pc, 3] >= 0:
                        pos = _put_long(out, pos, ops[pc, 3])  # the value's branch
                    start = raw_at
                    for c in range(column):
                        start += raw_counts[e, c]
                    pos = _copy(out, pos, raw_bytes, start, raw_counts[e, column])
                else:
                    pos = _put_long(out, pos, ops[pc, 2])  # the null branch
            pc += 1
        first += item_counts[e]
        for c in range(raw_counts.shape[1]):
            raw_at += raw_counts[e, c]
    out_offsets[len(user_ids)] = pos
