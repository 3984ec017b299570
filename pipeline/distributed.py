"""Figures and files of a multi-rank job (the ranks themselves run :func:`pipeline.serve.serve`)."""

from __future__ import annotations

from pathlib import Path

from model.rank import RankContext
from pipeline.metrics import Metrics


def step_stats(metrics: Metrics) -> dict[str, float]:
    """This rank's step and collective times so far, from its Prometheus histograms.

    Args:
        metrics: the rank's metrics.

    Returns:
        ``steps``, ``step_seconds`` (sum), ``step_mean_ms``, ``collective_seconds`` (sum over
        ops: the step agreement of every loop iteration, idle ones and the wait for slower
        ranks included) and ``collective_share``: collective / (step + collective) seconds.

    Example::

        step_stats(metrics)["collective_share"]  # 0.12
    """
    steps = step_sum = coll_sum = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "streamrank_rank_step_duration_seconds_count":
                steps += sample.value
            elif sample.name == "streamrank_rank_step_duration_seconds_sum":
                step_sum += sample.value
            elif sample.name == "streamrank_collective_duration_seconds_sum":
                coll_sum += sample.value
    return {
        "steps": steps,
        "step_seconds": round(step_sum, 4),
        "step_mean_ms": round(1000 * step_sum / steps, 3) if steps else 0.0,
        "collective_seconds": round(coll_sum, 4),
        "collective_share": round(coll_sum / (step_sum + coll_sum), 4) if coll_sum else 0.0,
    }


def summary_path(path: Path | None, rank: RankContext) -> Path | None:
    """Per-rank summary file: ``run.json`` -> ``run.rank1.json`` (rank 0 keeps the name)."""
    if path is None or not rank.distributed or rank.rank == 0:
        return path
    return path.with_suffix(f".rank{rank.rank}{path.suffix}")
