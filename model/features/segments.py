"""Index arithmetic over segments: flat arrays cut into consecutive runs by per-segment counts.

A batch stores jagged data columnar: ``counts`` (int64[S], one entry per segment, e.g. rows per
event) and one flat array holding every segment's items back to back (segment 0's, then
segment 1's, ...). These helpers turn counts into the indices that address the flat array,
vectorised with numpy (no Python loop over segments or items); :func:`group_values` groups
int64 values (distinct, first and last index, each one's group) in one compiled pass.

Example::

    counts = np.array([2, 0, 3])
    offsets(counts)       # [0, 2, 2, 5]
    starts(counts)        # [0, 2, 2]
    segment_ids(counts)   # [0, 0, 2, 2, 2]
    positions(counts)     # [0, 1, 0, 1, 2]
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from model.kernels import kernel

__all__ = [
    "Int64Array",
    "flatten",
    "group_values",
    "offsets",
    "positions",
    "segment_ids",
    "starts",
    "take_segments",
]

Int64Array = npt.NDArray[np.int64]


def offsets(counts: npt.ArrayLike) -> Int64Array:
    """Where each segment starts, plus the total at the end: ``[0, c0, c0+c1, ..., sum]``.

    Args:
        counts: int[S] items per segment.

    Returns:
        int64[S + 1]; segment ``s`` is ``flat[out[s]:out[s + 1]]``.

    Example::

        offsets(np.array([2, 0, 3]))  # [0, 2, 2, 5]
    """
    c = np.asarray(counts, dtype=np.int64)
    out = np.zeros(c.shape[0] + 1, dtype=np.int64)
    np.cumsum(c, out=out[1:])
    return out


def starts(counts: npt.ArrayLike) -> Int64Array:
    """Where each segment starts in the flat array (exclusive prefix sums).

    Args:
        counts: int[S] items per segment.

    Returns:
        int64[S].

    Example::

        starts(np.array([2, 0, 3]))  # [0, 2, 2]
    """
    return offsets(counts)[:-1]


def segment_ids(counts: npt.ArrayLike) -> Int64Array:
    """The segment of every item: ``[0]*c0 + [1]*c1 + ...`` (e.g. the event of every row).

    Args:
        counts: int[S] items per segment.

    Returns:
        int64[sum(counts)], non-decreasing; empty segments' ids do not occur.

    Example::

        segment_ids(np.array([2, 0, 3]))  # [0, 0, 2, 2, 2]
    """
    c = np.asarray(counts, dtype=np.int64)
    return np.repeat(np.arange(c.shape[0], dtype=np.int64), c)


def positions(counts: npt.ArrayLike) -> Int64Array:
    """Every item's position inside its segment (0, 1, ... per segment).

    ``flat[starts(counts)[segment_ids(counts)] + positions(counts)]`` is ``flat`` itself.

    Args:
        counts: int[S] items per segment.

    Returns:
        int64[sum(counts)]: 0 for each segment's first item, 1 for its second, ...

    Example::

        positions(np.array([2, 0, 3]))  # [0, 1, 0, 1, 2]
    """
    c = np.asarray(counts, dtype=np.int64)
    return np.arange(int(c.sum()), dtype=np.int64) - np.repeat(starts(c), c)


def take_segments(
    counts: npt.ArrayLike, index: npt.ArrayLike, lengths: npt.ArrayLike | None = None
) -> Int64Array:
    """Flat indices that gather segments ``index[0], index[1], ...`` back to back.

    Args:
        counts: int[S] items per segment of the source.
        index: int[K] the source segments to take, in output order (repeats allowed).
        lengths: int[K] items to take from the head of each taken segment (each at most its
            segment's count); default: the whole segment.

    Returns:
        int64[sum(lengths)] positions in the source's flat array; ``flat[out]`` is the
        gathered data, whose per-segment counts are ``lengths`` (or ``counts[index]``).

    Example::

        take_segments(np.array([2, 3]), np.array([1, 1, 0]))  # [2, 3, 4, 2, 3, 4, 0, 1]
        take_segments(np.array([2, 3]), np.array([1, 0]), np.array([1, 2]))  # [2, 0, 1]
    """
    c = np.asarray(counts, dtype=np.int64)
    idx = np.asarray(index, dtype=np.int64)
    taken = c[idx] if lengths is None else np.asarray(lengths, dtype=np.int64)
    return np.repeat(starts(c)[idx], taken) + positions(taken)


def flatten(
    segments: Sequence[Sequence[int] | npt.NDArray[np.integer]],
) -> tuple[Int64Array, Int64Array]:
    """Per-segment lists or arrays of ints -> ``(counts, flat)`` columns.

    Args:
        segments: one sequence per segment (lists or 1-d integer arrays, read-only ones too).

    Returns:
        ``(int64[S] counts, int64[sum(counts)] flat)``.

    Example::

        flatten([[7, 8], [], np.array([9])])  # ([2, 0, 1], [7, 8, 9])
    """
    n = len(segments)
    counts = np.fromiter(map(len, segments), np.int64, n)
    if n and all(isinstance(s, np.ndarray) for s in segments):
        return counts, np.concatenate(segments).astype(np.int64, copy=False)
    flat = np.fromiter(itertools.chain.from_iterable(segments), np.int64, int(counts.sum()))
    return counts, flat


@kernel
def group_values(values: Int64Array) -> tuple[Int64Array, Int64Array, Int64Array, Int64Array]:
    """Int64 values (C-contiguous) grouped by value in one compiled pass: a stable sort, then
    one walk. What ``np.unique`` gives with ``return_index`` and ``return_inverse``, without
    its cost per call (tens of µs) on the short arrays of one batch (the enricher's missed ids,
    the offsets a batch consumed per partition).

    Returns:
        ``(heads, first, last, group)``: the distinct values (ascending), the index where each
        first and last occurs, and each value's group.

    Example::

        heads, first, last, group = group_values(np.array([5, 3, 5]))
        # heads [3, 5], first [1, 0], last [1, 2], group [1, 0, 1]
    """
    order = np.argsort(values, kind="mergesort")
    heads = np.empty(len(values), dtype=np.int64)
    first = np.empty(len(values), dtype=np.int64)
    last = np.empty(len(values), dtype=np.int64)
    group = np.empty(len(values), dtype=np.int64)
    n = 0
    for i in order:
        if n == 0 or heads[n - 1] != values[i]:
            heads[n] = values[i]
            first[n] = i
            n += 1
        last[n - 1] = i
        group[i] = n - 1
    return heads[:n], first[:n], last[:n], group
