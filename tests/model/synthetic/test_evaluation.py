"""Tests for model.synthetic.evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model.synthetic.evaluation import log_loss, roc_auc


def _pairwise_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


@pytest.mark.parametrize("seed", range(4))
def test_auc_matches_pairwise_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=300)
    scores = np.round(rng.random(300) + 0.3 * labels, 1)  # many ties
    assert roc_auc(labels, scores) == pytest.approx(_pairwise_auc(labels, scores), abs=1e-12)


def test_auc_edge_cases() -> None:
    assert roc_auc([0, 1, 0, 1], [0.1, 0.8, 0.8, 0.9]) == pytest.approx(0.875)
    assert roc_auc([0, 1], [0.2, 0.1]) == 0.0
    assert roc_auc([1, 1, 0], [0.5, 0.5, 0.5]) == 0.5
    assert math.isnan(roc_auc([1, 1], [0.1, 0.2]))
    with pytest.raises(ValueError):
        roc_auc([0, 1], [0.1, 0.2, 0.3])


def test_log_loss() -> None:
    assert log_loss([1, 0], [0.9, 0.1]) == pytest.approx(-math.log(0.9))
    assert math.isfinite(log_loss([1], [0.0]))  # clipped
    assert math.isnan(log_loss([], []))
