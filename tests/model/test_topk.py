"""Tests for model.topk against a slow reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.topk import top_k_per_event


def _slow_top_k(
    scores: np.ndarray, counts: np.ndarray, ks: np.ndarray
) -> tuple[list[int], list[int], list[float]]:
    out_counts: list[int] = []
    rows: list[int] = []
    vals: list[float] = []
    start = 0
    for count, k in zip(counts.tolist(), ks.tolist(), strict=True):
        idx = list(range(start, start + count))
        # Best first, ties broken by the lower row index.
        idx.sort(key=lambda r: (-scores[r], r))
        chosen = idx[: max(0, min(k, count))]
        out_counts.append(len(chosen))
        rows.extend(chosen)
        vals.extend(float(scores[r]) for r in chosen)
        start += count
    return out_counts, rows, vals


@pytest.mark.parametrize("seed", range(5))
def test_matches_slow_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    num_events = 50
    counts = rng.integers(0, 40, size=num_events).astype(np.int64)
    ks = rng.integers(-1, 50, size=num_events).astype(np.int64)  # includes k <= 0 and k > count
    # Coarse scores so that ties are frequent.
    scores = np.round(rng.random(int(counts.sum())), 1).astype(np.float32)
    top = top_k_per_event(torch.from_numpy(scores), counts, ks)
    exp_counts, exp_rows, exp_vals = _slow_top_k(scores, counts, ks)
    assert top.counts.tolist() == exp_counts
    assert top.row_index.tolist() == exp_rows
    np.testing.assert_array_equal(top.scores, np.array(exp_vals, dtype=np.float32))
    assert top.row_index.dtype == np.int64 and top.counts.dtype == np.int64
    assert top.scores.dtype == np.float32
    assert top.offsets.tolist() == [0, *np.cumsum(exp_counts).tolist()]


def test_small_example_and_item_lookup() -> None:
    candidate_ids = np.array([100, 101, 102], dtype=np.int64)
    top = top_k_per_event(torch.tensor([0.1, 0.9, 0.5]), np.array([2, 1]), np.array([1, 5]))
    assert top.counts.tolist() == [1, 1]
    assert candidate_ids[top.row_index].tolist() == [101, 102]
    np.testing.assert_allclose(top.scores, [0.9, 0.5])


def test_neg_inf_scores_rank_before_padding() -> None:
    scores = torch.tensor([float("-inf"), 1.0, float("-inf")], dtype=torch.float64)
    top = top_k_per_event(scores, np.array([3]), np.array([10]))
    assert top.row_index.tolist() == [1, 0, 2]
    assert top.scores.dtype == np.float64


def test_empty_inputs() -> None:
    top = top_k_per_event(torch.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert top.counts.shape == (0,) and top.row_index.shape == (0,) and top.scores.shape == (0,)
    top = top_k_per_event(torch.zeros(0), np.zeros(3, dtype=np.int64), np.full(3, 5))
    assert top.counts.tolist() == [0, 0, 0]


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="rows"):
        top_k_per_event(torch.zeros(4), np.array([2, 1]), np.array([1, 1]))
    with pytest.raises(ValueError, match="equal"):
        top_k_per_event(torch.zeros(3), np.array([2, 1]), np.array([1]))
    with pytest.raises(ValueError, match="1-d"):
        top_k_per_event(torch.zeros(3, 1), np.array([2, 1]), np.array([1, 1]))
