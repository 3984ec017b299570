"""Offline ranking metrics in plain numpy."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["log_loss", "roc_auc"]


def roc_auc(labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Exact ROC AUC via the Mann-Whitney rank statistic.

    Tied scores get their average rank, i.e. a tied (positive, negative) pair counts 1/2.

    Args:
        labels: [N] binary labels (non-zero = positive).
        scores: [N] scores, higher = more likely positive.

    Returns:
        AUC in ``[0, 1]``, or ``nan`` if only one class is present.

    Raises:
        ValueError: if the shapes differ or are not 1-d.

    Example::

        roc_auc([0, 1, 0, 1], [0.1, 0.8, 0.8, 0.9])  # 0.875
    """
    y = np.asarray(labels).reshape(-1) != 0
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.shape[0] != y.shape[0] or np.asarray(labels).ndim != 1:
        raise ValueError(
            f"labels and scores must be equal-length 1-d arrays, got "
            f"{np.shape(labels)} and {np.shape(scores)}"
        )
    num_pos = int(y.sum())
    num_neg = y.shape[0] - num_pos
    if num_pos == 0 or num_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="stable")
    sorted_scores = s[order]
    # Average 1-based rank of each run of equal scores.
    run_start = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    run_end = np.r_[run_start[1:], s.shape[0]]
    run_rank = (run_start + run_end + 1) / 2.0
    ranks = np.empty(s.shape[0], dtype=np.float64)
    ranks[order] = np.repeat(run_rank, run_end - run_start)
    pos_rank_sum = float(ranks[y].sum())
    return (pos_rank_sum - num_pos * (num_pos + 1) / 2.0) / (num_pos * num_neg)


def log_loss(labels: npt.ArrayLike, probs: npt.ArrayLike, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities.

    Args:
        labels: [N] labels in ``{0, 1}`` (or soft labels in ``[0, 1]``).
        probs: [N] predicted probabilities, clipped to ``[eps, 1 - eps]``.
        eps: clipping bound.

    Returns:
        The mean log loss (nats); ``nan`` for empty input.

    Example::

        log_loss([1, 0], [0.9, 0.1])  # ~0.105
    """
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.clip(np.asarray(probs, dtype=np.float64).reshape(-1), eps, 1.0 - eps)
    if y.shape != p.shape:
        raise ValueError(f"labels {y.shape} and probs {p.shape} differ in shape")
    if y.size == 0:
        return float("nan")
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))
