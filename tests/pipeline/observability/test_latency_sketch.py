"""The latency sketch: quantiles within 0.5 % of the exact ones over a whole run, in constant
memory, and sketches that merge as if every latency had been added to one."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.observability.latency_sketch import MAX_S, MIN_S, RELATIVE_ERROR, LatencySketch

QUANTILES = np.linspace(0.0, 1.0, 201)


def _sketch(*chunks: np.ndarray) -> LatencySketch:
    sketch = LatencySketch()
    for chunk in chunks:
        sketch.add(chunk)
    return sketch


def _worst_relative_error(sketch: LatencySketch, exact: np.ndarray) -> float:
    return max(
        abs(sketch.quantile(q) - float(np.quantile(exact, q))) / float(np.quantile(exact, q))
        for q in QUANTILES
    )


@pytest.mark.parametrize(
    "latencies",
    [
        np.random.default_rng(1).lognormal(mean=-4.0, sigma=1.0, size=200_000),  # ~18 ms
        np.concatenate(  # two modes: fast batches and a slow tail
            [np.full(5_000, 0.004), np.random.default_rng(2).uniform(0.1, 2.5, 400)]
        ),
        np.array([0.010, 0.030, 0.020, 0.040]),
        np.array([3e-6, 7200.0]),  # from a few microseconds to two hours
    ],
    ids=["lognormal", "bimodal", "four", "extremes"],
)
def test_quantiles_are_within_the_stated_bound_of_the_exact_ones(latencies: np.ndarray) -> None:
    sketch = _sketch(*np.array_split(latencies, 7))
    assert len(sketch) == latencies.size
    assert _worst_relative_error(sketch, latencies) <= RELATIVE_ERROR * (1 + 1e-9)


def test_the_percentiles_cover_the_whole_run_in_constant_memory() -> None:
    """A run whose first 1.2 million events are fast and whose last 300,000 are slow: its p99
    is the slow ones' (a summary of the first million events would say 2 ms)."""
    sketch = LatencySketch()
    size = sketch.counts.nbytes
    rng = np.random.default_rng(3)
    for _ in range(12):
        sketch.add(rng.uniform(0.001, 0.003, 100_000))
    for _ in range(3):
        sketch.add(rng.uniform(0.200, 0.300, 100_000))
    assert len(sketch) == 1_500_000 and sketch.counts.nbytes == size <= 32 * 1024
    assert 0.2 * (1 - RELATIVE_ERROR) <= sketch.quantile(0.99) <= 0.3 * (1 + RELATIVE_ERROR)
    assert sketch.quantile(0.5) <= 0.003 * (1 + RELATIVE_ERROR)


def test_merged_sketches_equal_one_sketch_of_everything() -> None:
    rng = np.random.default_rng(4)
    parts = [rng.lognormal(-3.0, 0.5, n) for n in (1000, 10, 0, 5000)]
    merged = LatencySketch()
    for part in parts:
        merged.merge(_sketch(part))
    whole = _sketch(np.concatenate(parts))
    np.testing.assert_array_equal(merged.counts, whole.counts)
    assert _worst_relative_error(merged, np.concatenate(parts)) <= RELATIVE_ERROR * (1 + 1e-9)


def test_zero_and_negative_latencies_count_as_zero_and_an_empty_sketch_is_nan() -> None:
    assert np.isnan(LatencySketch().quantile(0.5))
    sketch = _sketch(np.array([0.0, -0.5, 0.0, 0.010]))
    assert sketch.quantile(0.5) == 0.0 and len(sketch) == 4
    assert abs(sketch.quantile(1.0) - 0.010) <= 0.010 * RELATIVE_ERROR


def test_a_sketch_round_trips_through_json_and_refuses_other_parameters() -> None:
    sketch = _sketch(np.random.default_rng(5).lognormal(-4.0, 1.0, 3000))
    data = sketch.to_dict()
    np.testing.assert_array_equal(LatencySketch.from_dict(data).counts, sketch.counts)
    with pytest.raises(ValueError, match="other parameters"):
        LatencySketch.from_dict({**data, "relative_error": 0.01})


def test_every_value_lands_in_the_bucket_the_module_docstring_gives() -> None:
    """Bucket ``ceil(log_g(x / MIN_S))``; at or below ``MIN_S``, and NaN, the zero bucket;
    beyond ``MAX_S`` (infinity too) the last one."""
    gamma = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
    inside = np.random.default_rng(6).uniform(np.log(MIN_S), np.log(MAX_S), 100_000)
    values = np.exp(inside)
    sketch = _sketch(values)
    expected = np.ceil(np.log(values / MIN_S) / np.log(gamma)).astype(np.int64)
    np.testing.assert_array_equal(
        sketch.counts, np.bincount(expected, minlength=len(sketch.counts))
    )
    edges = _sketch(np.array([MIN_S, MIN_S / 2, np.nan, -np.inf, MAX_S * 10, np.inf]))
    assert edges.counts[0] == 4 and edges.counts[-1] == 2 and len(edges) == 6
