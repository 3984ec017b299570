"""Tests for model.serving.topk against a slow reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import model.serving.topk as topk_mod
from model.serving.topk import top_k_per_event


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


def _hard_scores(rng: np.random.Generator, n: int, dtype: torch.dtype) -> torch.Tensor:
    """Coarse scores (many ties) with NaN, +-inf and -0.0 among them."""
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=np.float64)
    values = np.round(rng.random(n), 1)
    pick = rng.random(n) < 0.2
    values[pick] = rng.choice(special, int(pick.sum()))
    return torch.from_numpy(values).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_host_kernel_equals_the_tensor_sort(dtype: torch.dtype, seed: int) -> None:
    """The CPU's compiled pass and the tensor path a GPU runs (here on the CPU) agree exactly:
    ties, NaN (first), +-inf, -0.0 == 0.0, events without candidates, k <= 0 and k > count."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 70, size=60).astype(np.int64)
    counts[:3] = [0, 1, 200]
    ks = rng.integers(-2, 90, size=60).astype(np.int64)
    scores = _hard_scores(rng, int(counts.sum()), dtype)
    top = top_k_per_event(scores, counts, ks)  # CPU tensor: the compiled pass
    take = np.minimum(np.maximum(ks, 0), counts)
    want_dtype = torch.float32 if dtype == torch.bfloat16 else dtype
    want = topk_mod._device_top_k(scores.to(want_dtype), counts, take, int(take.max()))
    assert top.counts.tolist() == want.counts.tolist()
    assert top.row_index.tolist() == want.row_index.tolist()
    np.testing.assert_array_equal(top.scores, want.scores)
    assert top.scores.dtype == want.scores.dtype
    as_f8 = scores.to(torch.float64).numpy()  # NaN first: NaN -> inf, inf -> the largest
    ordered = np.nan_to_num(as_f8, nan=np.inf, posinf=np.finfo(np.float64).max)
    slow_counts, slow_rows, _ = _slow_top_k(ordered, counts, ks)
    assert top.row_index.tolist() == slow_rows and top.counts.tolist() == slow_counts


@pytest.mark.parametrize("seed", range(3))
def test_task_columns_come_back_for_the_kept_rows_on_both_paths(seed: int) -> None:
    """A multi-task module's published columns: the kept rows' values, gathered with the
    selection (the tensor path gathers them on the device, in its one download)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 30, size=40).astype(np.int64)
    counts[:2] = [0, 1]
    ks = rng.integers(-1, 12, size=40).astype(np.int64)
    rows = int(counts.sum())
    scores = _hard_scores(rng, rows, torch.float32)
    tasks = torch.from_numpy(rng.random((rows, 3)).astype(np.float32))
    top = top_k_per_event(scores, counts, ks, tasks)
    take = np.minimum(np.maximum(ks, 0), counts)
    device = topk_mod._device_top_k(scores, counts, take, int(take.max()), tasks)
    assert top.tasks is not None and device.tasks is not None
    np.testing.assert_array_equal(top.tasks, tasks.numpy()[top.row_index])
    np.testing.assert_array_equal(device.tasks, tasks.numpy()[device.row_index])
    assert top.row_index.tolist() == device.row_index.tolist()
    none = top_k_per_event(scores, counts, np.zeros_like(ks), tasks)
    assert none.tasks is not None and none.tasks.shape == (0, 3)
    assert top_k_per_event(scores, counts, ks).tasks is None


def test_scores_made_under_inference_mode() -> None:
    with torch.inference_mode():
        scores = torch.tensor([0.2, 0.7, 0.1]) * 1.0
    top = top_k_per_event(scores, np.array([3]), np.array([2]))
    assert top.row_index.tolist() == [1, 0]
