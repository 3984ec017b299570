"""Tests for model.features.recent_items: the one recent-items rule (event items, then stored,
capped)."""

from __future__ import annotations

import numpy as np
import pytest

from model.features.recent_items import merge_recent_items
from model.features.segments import flatten


def _slow(event: list[list[int]], stored: list[list[int]], cap: int) -> list[list[int]]:
    return [(e + s)[:cap] for e, s in zip(event, stored, strict=True)]


@pytest.mark.parametrize("cap", [0, 1, 2, 3, 5, 20])
def test_matches_the_rule_written_as_a_loop(cap: int) -> None:
    rng = np.random.default_rng(cap)
    event = [rng.integers(0, 50, rng.integers(0, 4)).tolist() for _ in range(40)]
    stored = [rng.integers(50, 99, rng.integers(0, 6)).tolist() for _ in range(40)]
    counts, ids = merge_recent_items(*flatten(event), *flatten(stored), cap)
    expected = _slow(event, stored, cap)
    assert counts.tolist() == [len(x) for x in expected]
    assert ids.tolist() == [x for row in expected for x in row]


def test_no_events() -> None:
    counts, ids = merge_recent_items([], [], [], [], 5)
    assert counts.tolist() == [] and ids.tolist() == []
    assert counts.dtype == ids.dtype == np.int64


@pytest.mark.parametrize(
    ("event_counts", "event_ids", "stored_counts", "stored_ids"),
    [
        ([2], [7], [0], []),  # counts over the ids
        ([1], [7], [1, 0], [3]),  # the two sides' events differ
        ([-1], [], [1], [3]),  # a negative count
    ],
    ids=["short-ids", "events-differ", "negative"],
)
def test_inconsistent_counts_are_refused(
    event_counts: list[int], event_ids: list[int], stored_counts: list[int], stored_ids: list[int]
) -> None:
    with pytest.raises(ValueError):
        merge_recent_items(event_counts, event_ids, stored_counts, stored_ids, 5)
