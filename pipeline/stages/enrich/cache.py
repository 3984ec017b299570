"""The enricher's feature cache: int64 id -> fixed-size payload, a TTL per entry, the oldest
stored entry evicted first. A batch's ids are looked up, and the fetched ones stored, by one
compiled (numba) call each: no Python object per id.

Layout: one open-addressing hash table (linear probing, backward-shift deletion, no
tombstones) of ``size`` rows, a power of two at least twice the capacity. A row is a run of
int64 words starting on a 64-byte boundary:

====  ======================================================================================
word  content
====  ======================================================================================
0     the id
1     low 32 bits: the entry's ring slot + 1 (0: the row is empty); high 32 bits: the stamp
      of the last lookup that served it (so each id counts once per lookup)
2     when it was stored (float64, ``time.monotonic`` seconds)
3...  the payload: ``num_ints`` int64 words, then ``num_floats`` float32 values
====  ======================================================================================

A hit reads one row (one cache line for the item features of the default model), so a lookup
costs about one memory access per distinct id. Payload too wide to sit in the row (a user's
recent items) lives in a side array indexed by ring slot.

Eviction: ``capacity`` ring slots are handed out in turn; storing an id takes the next slot and
evicts the id that held it, unless that id was stored again since (it lives in a newer slot).

Example::

    cache = FeatureCache(capacity=1000, ttl_s=30.0, num_ints=1, num_floats=8)
    found = cache.lookup(ids, time.monotonic())     # found.missing: fetch those
    cache.store(fetched_ids, ints, floats, None, time.monotonic())
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from model.kernels import kernel

__all__ = ["CacheLookup", "FeatureCache"]

_MIX = np.uint64(0x9E3779B97F4A7C15)
_HEADER = 3
"""Words before the payload: id, state, stored-at."""
_LOW = 0xFFFFFFFF
_MAX_STAMP = 2**31 - 1
_ROW_ALIGN_WORDS = 8
"""Rows are padded to whole 64-byte cache lines."""
_PREFETCH_AHEAD = 16
"""A lookup asks the CPU for the row of the id this many ids ahead while it reads this one's:
a batch's rows are mostly out of the CPU caches, and their reads overlap instead of queueing."""


@intrinsic
def _prefetch_intrinsic(typingctx: object, array: types.Array, index: types.Integer) -> object:
    """``llvm.prefetch`` (read, keep in all cache levels) of ``array[index]`` (1-d)."""

    def codegen(context: object, builder: ir.IRBuilder, signature: object, args: list) -> object:
        data = context.make_array(signature.args[0])(context, builder, args[0]).data  # type: ignore[attr-defined]
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        )
        address = builder.bitcast(builder.gep(data, [args[1]]), byte_ptr)
        builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()  # type: ignore[attr-defined]

    return types.void(array, index), codegen


_prefetch = cast(Callable[[npt.NDArray[np.int64], int], None], _prefetch_intrinsic)


@kernel
def _home(key: int, mask: int) -> int:
    h = np.uint64(key) * _MIX
    return int(np.int64((h ^ (h >> np.uint64(29))) & np.uint64(mask)))


@kernel
def _row_of(table: npt.NDArray[np.int64], key: int, mask: int) -> int:
    """The row holding ``key``, or the empty row where it would go."""
    pos = _home(key, mask)
    while (table[pos, 1] & _LOW) != 0 and table[pos, 0] != key:
        pos = (pos + 1) & mask
    return pos


@kernel
def _lookup(
    table: npt.NDArray[np.int64],
    words: npt.NDArray[np.int64],
    floats: npt.NDArray[np.float32],
    times: npt.NDArray[np.float64],
    side: npt.NDArray[np.int64],
    ids: npt.NDArray[np.int64],
    cutoff: float,
    stamp: int,
    num_ints: int,
    num_floats: int,
) -> tuple[
    npt.NDArray[np.int64],
    npt.NDArray[np.float32],
    npt.NDArray[np.int64],
    npt.NDArray[np.bool_],
    npt.NDArray[np.int64],
    int,
]:
    """The payload of every live id in row ``i`` of the outputs (zeros for the others).

    Returns:
        ``(ints, floats, side, missing, missing_rows, served)``: ``served`` counts the distinct
        ids served (rows stamped with ``stamp`` count once).
    """
    n, mask, width = len(ids), table.shape[0] - 1, side.shape[1]
    out_ints = np.zeros((n, num_ints), dtype=np.int64)
    out_floats = np.zeros((n, num_floats), dtype=np.float32)
    out_side = np.zeros((n, width), dtype=np.int64)
    missing = np.zeros(n, dtype=np.bool_)
    missing_rows = np.empty(n, dtype=np.int64)
    first_float = 2 * (_HEADER + num_ints)
    width_words = table.shape[1]
    for i in range(min(n, _PREFETCH_AHEAD)):
        _prefetch(words, _home(ids[i], mask) * width_words)
    served = misses = 0
    for i in range(n):
        if i + _PREFETCH_AHEAD < n:
            _prefetch(words, _home(ids[i + _PREFETCH_AHEAD], mask) * width_words)
        pos = _row_of(table, ids[i], mask)
        state = table[pos, 1]
        slot = (state & _LOW) - 1
        if slot < 0 or times[pos, 2] < cutoff:
            missing[i] = True
            missing_rows[misses] = i
            misses += 1
            continue
        if (state >> 32) != stamp:
            table[pos, 1] = (stamp << 32) | (slot + 1)
            served += 1
        for j in range(num_ints):
            out_ints[i, j] = table[pos, _HEADER + j]
        for j in range(num_floats):
            out_floats[i, j] = floats[pos, first_float + j]
        for j in range(width):
            out_side[i, j] = side[slot, j]
    return out_ints, out_floats, out_side, missing, missing_rows[:misses], served


@kernel
def _fill(
    ints: npt.NDArray[np.int64],
    floats: npt.NDArray[np.float32],
    side: npt.NDArray[np.int64],
    missing: npt.NDArray[np.bool_],
    rows: npt.NDArray[np.int64],
    source: npt.NDArray[np.int64],
    new_ints: npt.NDArray[np.int64],
    new_floats: npt.NDArray[np.float32],
    new_side: npt.NDArray[np.int64],
    new_missing: npt.NDArray[np.bool_],
) -> None:
    """Row ``rows[k]`` takes payload row ``source[k]`` unless that one is missing too."""
    for k in range(len(rows)):
        r, s = rows[k], source[k]
        if new_missing[s]:
            continue
        missing[r] = False
        ints[r, :] = new_ints[s, :]
        floats[r, :] = new_floats[s, :]
        side[r, :] = new_side[s, :]


@kernel
def _delete(table: npt.NDArray[np.int64], pos: int, mask: int) -> None:
    """Empty row ``pos`` and shift back the rows of its probe run (no tombstones)."""
    words = table.shape[1]
    table[pos, 1] = 0
    nxt = (pos + 1) & mask
    while (table[nxt, 1] & _LOW) != 0:
        home = _home(table[nxt, 0], mask)
        # Move the row at nxt into the hole unless its home lies cyclically in (pos, nxt].
        if (nxt > pos and (home <= pos or home > nxt)) or (nxt < pos and pos >= home > nxt):
            for j in range(words):
                table[pos, j] = table[nxt, j]
            table[nxt, 1] = 0
            pos = nxt
        nxt = (nxt + 1) & mask


@kernel
def _store(
    table: npt.NDArray[np.int64],
    floats: npt.NDArray[np.float32],
    times: npt.NDArray[np.float64],
    side: npt.NDArray[np.int64],
    ring: npt.NDArray[np.int64],
    next_slot: int,
    ids: npt.NDArray[np.int64],
    new_ints: npt.NDArray[np.int64],
    new_floats: npt.NDArray[np.float32],
    new_side: npt.NDArray[np.int64],
    now: float,
) -> int:
    """Store ``ids[i]`` with row ``i`` of the payloads in the next ring slots.

    Returns:
        The ring slot the next store starts at.
    """
    mask = table.shape[0] - 1
    capacity = len(ring)
    num_ints, num_floats, width = new_ints.shape[1], new_floats.shape[1], new_side.shape[1]
    first_float = 2 * (_HEADER + num_ints)
    for i in range(len(ids)):
        slot = next_slot
        next_slot = (next_slot + 1) % capacity
        old = _row_of(table, ring[slot], mask)
        if (table[old, 1] & _LOW) == slot + 1:  # the slot's id still lives in it: evict
            _delete(table, old, mask)
        pos = _row_of(table, ids[i], mask)
        table[pos, 0] = ids[i]
        table[pos, 1] = slot + 1
        times[pos, 2] = now
        for j in range(num_ints):
            table[pos, _HEADER + j] = new_ints[i, j]
        for j in range(num_floats):
            floats[pos, first_float + j] = new_floats[i, j]
        for j in range(width):
            side[slot, j] = new_side[i, j]
        ring[slot] = ids[i]
    return next_slot


@kernel
def _clear_stamps(table: npt.NDArray[np.int64]) -> None:
    for pos in range(table.shape[0]):
        table[pos, 1] &= _LOW


@dataclass
class CacheLookup:
    """Payloads of ``n`` ids, row ``i`` for ``ids[i]`` (what a lookup found, or what Redis
    returned).

    Attributes:
        ints: int64[n, num_ints] the payload's int words (zeros where missing).
        floats: float32[n, num_floats] its float values (zeros where missing).
        side: int64[n, side_width] its side row (zeros where missing).
        missing: bool[n], absent or expired.
        missing_rows: int64, the rows where ``missing`` is set, in order.
        served: distinct ids served from the cache.
    """

    ints: npt.NDArray[np.int64]
    floats: npt.NDArray[np.float32]
    side: npt.NDArray[np.int64]
    missing: npt.NDArray[np.bool_]
    missing_rows: npt.NDArray[np.int64]
    served: int = 0

    @classmethod
    def defaults(cls, n: int, num_ints: int, num_floats: int, side_width: int) -> CacheLookup:
        """``n`` payloads of zeros, all missing."""
        return cls(
            ints=np.zeros((n, num_ints), dtype=np.int64),
            floats=np.zeros((n, num_floats), dtype=np.float32),
            side=np.zeros((n, side_width), dtype=np.int64),
            missing=np.ones(n, dtype=np.bool_),
            missing_rows=np.arange(n, dtype=np.int64),
        )

    def fill(
        self, rows: npt.NDArray[np.int64], source: npt.NDArray[np.int64], new: CacheLookup
    ) -> None:
        """Rows ``rows`` take the payload of ``new``'s rows ``source`` (those not missing there).

        Args:
            rows: int64[k] rows of this lookup.
            source: int64[k] the row of ``new`` for each.
            new: e.g. what Redis returned for the ids this lookup missed.
        """
        _fill(
            self.ints, self.floats, self.side, self.missing, rows, source,
            new.ints, new.floats, new.side, new.missing,
        )  # fmt: skip


class FeatureCache:
    """A fixed-capacity id -> payload cache with a TTL (see the module docstring).

    Args:
        capacity: entries it holds (at least 1).
        ttl_s: an entry older than this is missing.
        num_ints: int64 words of payload per entry.
        num_floats: float32 values of payload per entry.
        side_width: int64 words per entry kept in the side array (0: none).
    """

    def __init__(
        self, capacity: int, ttl_s: float, num_ints: int, num_floats: int, side_width: int = 0
    ) -> None:
        self.capacity = max(1, capacity)
        self._ttl_s = ttl_s
        self._num_ints, self._num_floats, self._side_width = num_ints, num_floats, side_width
        words = _HEADER + num_ints + (num_floats + 1) // 2
        words = -(-words // _ROW_ALIGN_WORDS) * _ROW_ALIGN_WORDS
        size = 1 << max(4, (2 * self.capacity - 1).bit_length())
        raw = np.zeros(size * words + _ROW_ALIGN_WORDS, dtype=np.int64)
        skip = (-raw.ctypes.data % (8 * _ROW_ALIGN_WORDS)) // 8
        self._table = raw[skip : skip + size * words].reshape(size, words)
        self._words = self._table.reshape(-1)
        self._floats = self._table.view(np.float32)
        self._times = self._table.view(np.float64)
        self._side = np.zeros((self.capacity if side_width else 1, side_width), dtype=np.int64)
        self._ring = np.zeros(self.capacity, dtype=np.int64)
        # Resident now, as the table is (every row is written when the stamps are cleared):
        # their zero pages would otherwise become resident one ring slot at a time, growing the
        # RSS for minutes (32 MiB at the defaults) like a leak until the ring first wraps.
        self._side.fill(0)
        self._ring.fill(0)
        self._next = 0
        self._stamp = 0
        found = self.lookup(np.zeros(1, dtype=np.int64), 0.0)  # load (or compile) the kernels
        found.fill(found.missing_rows[:0], found.missing_rows[:0], found)  # now
        self.store(np.zeros(0, dtype=np.int64), None, None, None, 0.0)

    def lookup(self, ids: npt.NDArray[np.int64], now: float) -> CacheLookup:
        """The cached payload of every id (one compiled pass; duplicates allowed).

        Args:
            ids: int64[n].
            now: ``time.monotonic()``; entries stored before ``now - ttl_s`` are missing.

        Returns:
            The payloads, row ``i`` for ``ids[i]``, and which ids are missing.
        """
        self._stamp = self._stamp % _MAX_STAMP + 1
        if self._stamp == 1:
            _clear_stamps(self._table)  # stamps restart: none may look current
        found = _lookup(
            self._table, self._words, self._floats, self._times, self._side,
            np.ascontiguousarray(ids, dtype=np.int64), now - self._ttl_s, self._stamp,
            self._num_ints, self._num_floats,
        )  # fmt: skip
        return CacheLookup(*found)

    def store(
        self,
        ids: npt.NDArray[np.int64],
        ints: npt.NDArray[np.int64] | None,
        floats: npt.NDArray[np.float32] | None,
        side: npt.NDArray[np.int64] | None,
        now: float,
    ) -> None:
        """Store distinct ``ids`` with their payload rows (the last ``capacity`` of them when
        there are more), evicting the oldest entries.

        Args:
            ids: int64[n], no duplicates.
            ints: int64[n, num_ints] (``None``: no int payload).
            floats: float32[n, num_floats] (``None``: no float payload).
            side: int64[n, side_width] (``None``: no side payload).
            now: ``time.monotonic()``, the entries' time of storage.
        """
        keep = slice(max(0, len(ids) - self.capacity), None)
        n = len(ids[keep])
        self._next = _store(
            self._table, self._floats, self._times, self._side, self._ring, self._next,
            np.ascontiguousarray(ids[keep], dtype=np.int64),
            _rows(ints, keep, n, self._num_ints, np.int64),
            _rows(floats, keep, n, self._num_floats, np.float32),
            _rows(side, keep, n, self._side_width, np.int64),
            now,
        )  # fmt: skip


def _rows(payload: npt.NDArray[Any] | None, keep: slice, n: int, width: int, dtype: type) -> Any:
    """``payload[keep]`` as a C-contiguous ``[n, width]`` array (zeros for ``None``)."""
    if payload is None:
        return np.zeros((n, width), dtype=dtype)
    return np.ascontiguousarray(payload[keep], dtype=dtype).reshape(n, width)
