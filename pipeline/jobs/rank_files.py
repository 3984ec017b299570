"""Figures and files of a multi-rank job (the ranks themselves run
:func:`pipeline.runtime.serve.serve`)."""

from __future__ import annotations

import os
from pathlib import Path

from model.rank import RankContext
from pipeline.observability.metrics import Metrics


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
    """Where this process writes its own summary file (``--summary-json``), if anywhere.

    One process: ``path``. A rank under a plain ``torchrun`` (no ``streamrank run --nproc``
    launcher to merge): ``run.json`` -> ``run.rank<R>.json`` for every rank. The ranks of
    ``streamrank run --nproc`` write records for the launcher instead
    (:func:`pipeline.runtime.summary.write_rank_summary`) and get ``None`` here: the launcher writes
    the merged summary to ``path``.
    """
    from pipeline.runtime.summary import RANK_SUMMARIES_ENV

    if path is None or not rank.distributed:
        return path
    if os.environ.get(RANK_SUMMARIES_ENV):
        return None
    return path.with_suffix(f".rank{rank.rank}{path.suffix}")
