"""Tests for model.features.segments: index arithmetic over per-segment counts."""

from __future__ import annotations

import numpy as np

from model.features.segments import (
    flatten,
    group_values,
    offsets,
    positions,
    segment_ids,
    starts,
    take_segments,
)

COUNTS = np.array([2, 0, 1, 3], dtype=np.int64)


def test_offsets_starts_ids_positions() -> None:
    assert offsets(COUNTS).tolist() == [0, 2, 2, 3, 6]
    assert starts(COUNTS).tolist() == [0, 2, 2, 3]
    assert segment_ids(COUNTS).tolist() == [0, 0, 2, 3, 3, 3]
    assert positions(COUNTS).tolist() == [0, 1, 0, 0, 1, 2]
    for fn in (starts, segment_ids, positions):
        assert fn(np.zeros(0, dtype=np.int64)).tolist() == []
        assert fn(COUNTS).dtype == np.int64
    assert offsets(np.zeros(0, dtype=np.int64)).tolist() == [0]


def test_take_segments_matches_a_python_loop() -> None:
    flat = np.arange(100, 106)
    index = np.array([3, 0, 3, 1, 2])
    expected = [x for i in index for x in flat[offsets(COUNTS)[i] : offsets(COUNTS)[i + 1]]]
    assert flat[take_segments(COUNTS, index)].tolist() == expected
    heads = np.array([1, 2, 0, 0, 1])
    expected_heads = [
        x for i, h in zip(index, heads, strict=True) for x in flat[starts(COUNTS)[i] :][:h]
    ]
    assert flat[take_segments(COUNTS, index, heads)].tolist() == expected_heads
    assert take_segments(COUNTS, np.zeros(0, dtype=np.int64)).tolist() == []


def test_flatten_lists_and_arrays() -> None:
    counts, flat = flatten([[7, 8], [], [9]])
    assert counts.tolist() == [2, 0, 1] and flat.tolist() == [7, 8, 9]
    read_only = np.array([4, 5], dtype=np.int64)
    read_only.flags.writeable = False
    counts, flat = flatten([read_only, np.zeros(0, dtype=np.int64)])
    assert counts.tolist() == [2, 0] and flat.tolist() == [4, 5] and flat.dtype == np.int64
    counts, flat = flatten([])
    assert counts.tolist() == [] and flat.tolist() == []


def test_group_values_matches_np_unique() -> None:
    rng = np.random.default_rng(11)
    for size in (0, 1, 7, 500):
        values = rng.integers(-3, 20, size)
        heads, first, last, group = group_values(values)
        want, want_first, want_group = np.unique(values, return_index=True, return_inverse=True)
        want_last = size - 1 - np.unique(values[::-1], return_index=True)[1]
        np.testing.assert_array_equal(heads, want)
        np.testing.assert_array_equal(first, want_first)
        np.testing.assert_array_equal(last, want_last)
        np.testing.assert_array_equal(group, want_group.reshape(-1))
