"""FeatureCache against a plain-Python model of the same rules (TTL, oldest stored evicted
first, a re-stored id lives in its newer slot), on random operations."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from pipeline.stages.enrich.cache import CacheLookup, FeatureCache

INTS, FLOATS, SIDE = 2, 3, 4


@dataclass
class ModelCache:
    """The reference: a ring of slots and a dict of live ids."""

    capacity: int
    ttl_s: float
    ring: list[int | None] = field(default_factory=list)
    live: dict[int, tuple[int, float, tuple[list[int], list[float], list[int]]]] = field(
        default_factory=dict
    )
    next: int = 0

    def __post_init__(self) -> None:
        self.ring = [None] * self.capacity

    def lookup(self, ids: list[int], now: float) -> tuple[list[object], int]:
        out: list[object] = []
        served: set[int] = set()
        for i in ids:
            entry = self.live.get(i)
            if entry is None or entry[1] < now - self.ttl_s:
                out.append(None)
            else:
                out.append(entry[2])
                served.add(i)
        return out, len(served)

    def store(self, ids: list[int], payloads: list[tuple], now: float) -> None:
        ids, payloads = ids[-self.capacity :], payloads[-self.capacity :]
        for i, payload in zip(ids, payloads, strict=True):
            slot = self.next
            self.next = (self.next + 1) % self.capacity
            old = self.ring[slot]
            if old is not None and old in self.live and self.live[old][0] == slot:
                del self.live[old]
            self.live[i] = (slot, now, payload)
            self.ring[slot] = i


def _payload(rng: np.random.Generator) -> tuple[list[int], list[float], list[int]]:
    return (
        rng.integers(-(2**62), 2**62, INTS).tolist(),
        rng.standard_normal(FLOATS).astype(np.float32).tolist(),
        rng.integers(-100, 100, SIDE).tolist(),
    )


def _check(found: CacheLookup, want: list[object]) -> None:
    for i, payload in enumerate(want):
        if payload is None:
            assert found.missing[i]
            assert not found.ints[i].any() and not found.floats[i].any() and not found.side[i].any()
        else:
            ints, floats, side = payload  # type: ignore[misc]
            assert not found.missing[i]
            assert found.ints[i].tolist() == ints
            assert found.floats[i].tolist() == floats
            assert found.side[i].tolist() == side
    assert found.missing_rows.tolist() == [i for i, p in enumerate(want) if p is None]


@pytest.mark.parametrize(("capacity", "seed"), [(1, 0), (3, 1), (17, 2), (64, 3), (500, 4)])
def test_agrees_with_the_reference_model(capacity: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cache = FeatureCache(capacity, ttl_s=5.0, num_ints=INTS, num_floats=FLOATS, side_width=SIDE)
    model = ModelCache(capacity, 5.0)
    universe = np.concatenate([rng.integers(-(2**63), 2**63 - 1, 40), [0, -1, 2**63 - 1]])
    now = 100.0
    for _ in range(60):
        now += float(rng.choice([0.0, 0.5, 2.0, 6.0]))
        ids = rng.choice(universe, rng.integers(0, 30)).astype(np.int64)  # duplicates too
        found = cache.lookup(ids, now)
        want, served = model.lookup(ids.tolist(), now)
        _check(found, want)
        assert found.served == served
        todo = np.unique(ids[found.missing_rows])
        keep = todo[rng.random(len(todo)) < 0.7]  # some "missing in Redis": never stored
        payloads = [_payload(rng) for _ in keep]
        cache.store(
            keep,
            np.array([p[0] for p in payloads], dtype=np.int64).reshape(-1, INTS),
            np.array([p[1] for p in payloads], dtype=np.float32).reshape(-1, FLOATS),
            np.array([p[2] for p in payloads], dtype=np.int64).reshape(-1, SIDE),
            now,
        )
        model.store(keep.tolist(), payloads, now)


def test_an_entry_expires_after_its_ttl_exactly() -> None:
    cache = FeatureCache(4, ttl_s=5.0, num_ints=1, num_floats=0)
    cache.store(np.array([7]), np.array([[42]]), None, None, now=10.0)
    assert not cache.lookup(np.array([7]), 15.0).missing[0]  # stored at now - ttl: still live
    assert cache.lookup(np.array([7]), 15.000001).missing[0]


def test_each_distinct_id_is_served_once_per_lookup() -> None:
    cache = FeatureCache(8, ttl_s=60.0, num_ints=1, num_floats=1)
    cache.store(np.array([1, 2]), np.array([[10], [20]]), np.array([[0.5], [1.5]]), None, 0.0)
    found = cache.lookup(np.array([1, 1, 2, 3, 1]), 1.0)
    assert found.served == 2
    assert found.ints.reshape(-1).tolist() == [10, 10, 20, 0, 10]
    assert found.missing.tolist() == [False, False, False, True, False]
    assert cache.lookup(np.array([2]), 1.0).served == 1  # a new lookup counts again


def test_storing_more_than_the_capacity_keeps_the_last() -> None:
    cache = FeatureCache(2, ttl_s=60.0, num_ints=1, num_floats=0)
    cache.store(np.array([1, 2, 3]), np.array([[1], [2], [3]]), None, None, 0.0)
    assert cache.lookup(np.array([1, 2, 3]), 0.0).missing.tolist() == [True, False, False]


def test_empty_lookup() -> None:
    cache = FeatureCache(2, ttl_s=60.0, num_ints=1, num_floats=2, side_width=3)
    found = cache.lookup(np.zeros(0, dtype=np.int64), 0.0)
    assert found.ints.shape == (0, 1) and found.floats.shape == (0, 2)
    assert found.side.shape == (0, 3) and found.missing_rows.shape == (0,)


def _anon_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


def test_its_memory_is_resident_from_the_start_not_filled_in_while_serving() -> None:
    # A soak reads RSS growth while the cache first fills as a leak: the table and the side
    # array (64 MiB here) must be resident once built, so storing every slot grows nothing.
    cache = FeatureCache(capacity=400_000, ttl_s=30.0, num_ints=1, num_floats=8, side_width=20)
    side_mib = cache._side.nbytes / 2**20
    ids = np.arange(1, 400_001, dtype=np.int64)
    payload = np.ones((len(ids), 20), dtype=np.int64)
    before = _anon_mib()
    for chunk in range(0, len(ids), 50_000):  # what a serving process stores, batch by batch
        part = slice(chunk, chunk + 50_000)
        cache.store(ids[part], None, None, payload[part], now=1.0)
    grown = _anon_mib() - before
    assert side_mib > 60 and grown < 0.1 * side_mib, (grown, side_mib)
