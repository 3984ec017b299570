"""An int64 id -> slot hash table in numpy arrays, probed by compiled (numba) loops.

Open addressing with linear probing and backward-shift deletion (no tombstones), sized to a
power of two at least twice the number of slots, so probes stay short. It replaces a Python
dict on the enrichment hot path: a batch's ids are looked up in one call, no Python int per id.

Example::

    table = SlotTable(capacity=1000)
    table.assign(np.array([42, 7]), np.array([0, 1]))
    table.find(np.array([7, 8]))  # array([ 1, -1])
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

_MIX = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True)
def _home(key: int, mask: int) -> int:
    h = np.uint64(key) * _MIX
    return int(np.int64((h ^ (h >> np.uint64(29))) & np.uint64(mask)))


@numba.njit(cache=True, nogil=True)
def _position(keys: npt.NDArray[np.int64], slots: npt.NDArray[np.int64], key: int) -> int:
    """The table position holding ``key``, or the empty position where it would go."""
    mask = len(keys) - 1
    pos = _home(key, mask)
    while slots[pos] >= 0 and keys[pos] != key:
        pos = (pos + 1) & mask
    return pos


@numba.njit(cache=True, nogil=True)
def _find_all(
    keys: npt.NDArray[np.int64], slots: npt.NDArray[np.int64], ids: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    out = np.empty(len(ids), dtype=np.int64)
    for i in range(len(ids)):
        out[i] = slots[_position(keys, slots, ids[i])]
    return out


@numba.njit(cache=True, nogil=True)
def _delete(keys: npt.NDArray[np.int64], slots: npt.NDArray[np.int64], pos: int) -> None:
    """Empty ``pos`` and shift back the entries of its probe run (no tombstones)."""
    mask = len(keys) - 1
    slots[pos] = -1
    nxt = (pos + 1) & mask
    while slots[nxt] >= 0:
        home = _home(keys[nxt], mask)
        # Move the entry at nxt into the hole unless its home lies cyclically in (pos, nxt].
        if (nxt > pos and (home <= pos or home > nxt)) or (nxt < pos and pos >= home > nxt):
            keys[pos], slots[pos] = keys[nxt], slots[nxt]
            slots[nxt] = -1
            pos = nxt
        nxt = (nxt + 1) & mask


@numba.njit(cache=True, nogil=True)
def _assign_all(
    keys: npt.NDArray[np.int64],
    slots: npt.NDArray[np.int64],
    id_in_slot: npt.NDArray[np.int64],
    used: npt.NDArray[np.bool_],
    ids: npt.NDArray[np.int64],
    new_slots: npt.NDArray[np.int64],
) -> None:
    for i in range(len(ids)):
        slot = new_slots[i]
        if used[slot]:  # evict the slot's id, unless it was refreshed into another slot
            pos = _position(keys, slots, id_in_slot[slot])
            if slots[pos] == slot:
                _delete(keys, slots, pos)
        pos = _position(keys, slots, ids[i])
        keys[pos] = ids[i]
        slots[pos] = slot
        id_in_slot[slot] = ids[i]
        used[slot] = True


class SlotTable:
    """Maps ids to slots ``0 .. capacity - 1``; each slot holds at most one id.

    Args:
        capacity: number of slots.
    """

    def __init__(self, capacity: int) -> None:
        size = 1 << max(4, (2 * capacity - 1).bit_length())
        self._keys = np.zeros(size, dtype=np.int64)
        self._slots = np.full(size, -1, dtype=np.int64)
        self._id_in_slot = np.zeros(capacity, dtype=np.int64)
        self._used = np.zeros(capacity, dtype=bool)

    def find(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The slot of each id, -1 where absent."""
        return _find_all(self._keys, self._slots, ids)

    def assign(self, ids: npt.NDArray[np.int64], slots: npt.NDArray[np.int64]) -> None:
        """Put ``ids[i]`` in ``slots[i]``, evicting whatever id held that slot."""
        _assign_all(self._keys, self._slots, self._id_in_slot, self._used, ids, slots)
