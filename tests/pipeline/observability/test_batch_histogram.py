"""BatchHistogram exposes exactly what prometheus_client's Histogram does for the same values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from pipeline.observability.batch_histogram import BatchHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)


def _pair() -> tuple[CollectorRegistry, Histogram, CollectorRegistry, BatchHistogram]:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("x_seconds", "Doc.", buckets=BUCKETS, registry=theirs)
    histogram = BatchHistogram("x_seconds", "Doc.", BUCKETS, ours)
    return theirs, reference, ours, histogram


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.parametrize("seed", range(3))
def test_same_samples_as_prometheus_client(seed: int) -> None:
    theirs, reference, ours, histogram = _pair()
    rng = np.random.default_rng(seed)
    for _ in range(5):
        batch = np.concatenate(
            [
                10 ** rng.uniform(-4, 2, size=rng.integers(0, 50)),
                np.array(BUCKETS),  # values on a bound fall in that bound's bucket
                np.array([0.0, 100.0]),
            ]
        )
        histogram.observe_many(batch)
        for value in batch.tolist():
            reference.observe(value)
    got, want = _samples(ours), _samples(theirs)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key


def test_text_exposition_matches_line_for_line() -> None:
    theirs, reference, ours, histogram = _pair()
    for value in (0.0005, 0.01, 0.5, 3.0, 50.0):
        reference.observe(value)
        histogram.observe(value)
    text = [ln for ln in generate_latest(ours).decode().splitlines() if "_created" not in ln]
    want = [ln for ln in generate_latest(theirs).decode().splitlines() if "_created" not in ln]
    assert text == want
    assert any(
        ln.startswith("x_seconds_created ") for ln in generate_latest(ours).decode().split("\n")
    )


def test_empty_batches_and_nan() -> None:
    theirs, reference, ours, histogram = _pair()
    histogram.observe_many(np.zeros(0))
    assert _samples(ours) == _samples(theirs)
    histogram.observe_many(np.array([0.5, math.nan]))
    reference.observe(0.5)
    reference.observe(math.nan)
    got, want = _samples(ours), _samples(theirs)
    sums = [k for k in want if k[0] == "x_seconds_sum"]
    assert all(math.isnan(got[k]) and math.isnan(want[k]) for k in sums)
    assert {k: v for k, v in got.items() if k not in sums} == {
        k: v for k, v in want.items() if k not in sums
    }


def test_buckets_must_increase() -> None:
    with pytest.raises(ValueError, match="increasing"):
        BatchHistogram("y", "Doc.", (1.0, 0.5), None)
