"""The figures and files of a multi-rank job: each rank's summary record, and the launcher's
merge of them into one summary of the job.

With ``streamrank run --nproc N`` each rank writes a :func:`write_rank_summary` record (its
figures and its latency sketch) into the directory :data:`RANK_SUMMARIES_ENV` names, and the
launcher merges them (:func:`merge_rank_summaries`): the sketches add up, so the job's
percentiles are over every event of every rank.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from model.rank import RankContext
from pipeline.jobs.launch import DEGRADATIONS_ENV
from pipeline.observability.latency_sketch import LatencySketch
from pipeline.observability.metrics import Metrics
from pipeline.observability.summary import RunSummary, json_line, latency_percentiles_ms

RANK_SUMMARIES_ENV = "STREAMRANK_RANK_SUMMARIES"
"""Set by ``streamrank run --nproc N`` for its ranks: the directory they write their summaries
into (``rank<R>.json``), merged by the launcher when they are done."""


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
    (:func:`pipeline.jobs.summaries.write_rank_summary`) and get ``None`` here: the launcher writes
    the merged summary to ``path``.
    """
    if path is None or not rank.distributed:
        return path
    if os.environ.get(RANK_SUMMARIES_ENV):
        return None
    return path.with_suffix(f".rank{rank.rank}{path.suffix}")


def write_rank_summary(
    directory: Path,
    summary: RunSummary,
    rank: RankContext,
    rank_steps: dict[str, float] | None = None,
) -> Path:
    """Write this rank's summary and latency sketch into ``directory`` for the launcher.

    The record holds the rank, the world size, the attempt (torchrun's
    ``TORCHELASTIC_RESTART_COUNT`` and :data:`~pipeline.jobs.launch.DEGRADATIONS_ENV`: only the
    last attempt's ranks are merged), :meth:`RunSummary.as_dict`, ``rank_steps`` and the
    wall-clock times of the first input and the last output, and the latency sketch
    (:meth:`~pipeline.observability.latency_sketch.LatencySketch.to_dict`).

    Args:
        directory: the directory of :data:`RANK_SUMMARIES_ENV`.
        summary: this rank's run summary.
        rank: this rank's place in the job.
        rank_steps: this rank's step statistics (``pipeline.jobs.summaries.step_stats``).

    Returns:
        The path of the JSON record.

    Example::

        write_rank_summary(Path(os.environ[RANK_SUMMARIES_ENV]), summary, rank, steps)
    """
    to_wall = time.time() - time.monotonic()  # the run's times are time.monotonic()
    record = {
        "rank": rank.rank,
        "world_size": rank.world_size,
        "attempt": [
            int(os.environ.get(DEGRADATIONS_ENV, "0")),
            int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        ],
        "first_input_at": _wall(summary.first_input_at, to_wall),
        "last_output_at": _wall(summary.last_output_at, to_wall),
        "summary": {**summary.as_dict(), **({"rank_steps": rank_steps} if rank_steps else {})},
        "latency_sketch": summary.latencies.to_dict(),
    }
    path = directory / f"rank{rank.rank}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json_line(record))
    tmp.replace(path)  # the launcher never reads half a record
    return path


def _wall(monotonic_s: float | None, to_wall: float) -> float | None:
    return None if monotonic_s is None else monotonic_s + to_wall


def merge_rank_summaries(directory: Path) -> dict[str, Any] | None:
    """One summary of the job from the rank records in ``directory`` (:func:`write_rank_summary`).

    Only the records of the last attempt count (after a torchrun restart or a degradation the
    ranks start counting again). Counts are summed over the ranks; ``seconds`` is the longest
    rank's; ``busy_seconds`` runs from the first input of any rank to the last output of any
    rank (wall clock), and the rates divide by it; the latency percentiles are over the merged
    sketches of every rank (every event of the job, within 0.5 %), not an average of per-rank
    percentiles. ``ranks`` holds each rank's own summary.

    Args:
        directory: where the ranks wrote their records.

    Returns:
        The merged summary (the keys of :meth:`RunSummary.as_dict`, plus ``world_size``,
        ``ranks_reported`` and ``ranks``), or ``None`` when no rank wrote one.

    Example::

        merged = merge_rank_summaries(Path(tmp))
        merged["events_out"], [r["events_out"] for r in merged["ranks"]]
    """
    records = [json.loads(p.read_text()) for p in sorted(directory.glob("rank*.json"))]
    if not records:
        return None
    last = max(tuple(r["attempt"]) for r in records)
    records = sorted((r for r in records if tuple(r["attempt"]) == last), key=lambda r: r["rank"])
    parts = [r["summary"] for r in records]
    total = {
        key: sum(p[key] for p in parts)
        for key in ("events_in", "events_out", "dead_lettered", "rows_scored", "batches")
    }
    starts = [r["first_input_at"] for r in records if r["first_input_at"] is not None]
    ends = [r["last_output_at"] for r in records if r["last_output_at"] is not None]
    busy = max(ends) - min(starts) if starts and ends else 0.0
    pooled = LatencySketch()
    for record in records:
        pooled.merge(LatencySketch.from_dict(record["latency_sketch"]))
    return {
        **total,
        "seconds": max(p["seconds"] for p in parts),
        "busy_seconds": round(busy, 3),
        "events_per_s": round(total["events_out"] / busy, 1) if busy > 0 else 0.0,
        "rows_per_s": round(total["rows_scored"] / busy, 1) if busy > 0 else 0.0,
        **latency_percentiles_ms(pooled),
        "world_size": records[0]["world_size"],
        "ranks_reported": len(records),
        "ranks": [{"rank": r["rank"], **r["summary"]} for r in records],
    }
