"""Multi-rank scoring: one pipeline per rank, the ranker sharded across ranks with TorchRec.

``streamrank run --nproc N`` re-executes itself under ``torchrun`` (N ranks on this host, or on
each of ``--nnodes`` hosts, restarted together by torchrun when one dies; with ``--min-nproc``
started again with fewer ranks when they keep dying: :mod:`pipeline.launch`). Each rank then:

1. joins the process group (``cuda:{LOCAL_RANK}`` + NCCL with GPUs, else CPU + gloo);
2. plans the sharding of the embedding tables (``model.distributed``, config
   ``[model.sharding]``), wraps the ranker in ``DistributedModelParallel``; rank 0 logs the plan;
3. loads the checkpoint: a DCP checkpoint of any world size, or ``init-model``'s
   single-process one (each rank keeps the shards it owns);
4. runs the usual :class:`~pipeline.loop.ScoringPipeline` as a member of the Kafka consumer
   group, with a :class:`~pipeline.stepping.CollectiveStepper` so all ranks run each forward
   together, and commits its own partitions' offsets after delivery.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch.distributed as dist

from model.checkpoint import load_meta
from model.distributed import (
    describe_plan,
    join_process_group,
    load_sharded,
    plan_sharding,
    shard_ranker,
)
from model.memory import embedding_bytes
from model.quantize import QuantDtype
from pipeline.config import Settings
from pipeline.launch import DEGRADATIONS_ENV, arm_test_crash
from pipeline.lifetime import bind_rank_to_launcher
from pipeline.loop import ScoringPipeline
from pipeline.metrics import Metrics
from pipeline.stages.score import Scorer
from pipeline.stepping import CollectiveStepper
from pipeline.summary import RunSummary

log = logging.getLogger(__name__)


def in_torchrun() -> bool:
    """Whether this process is one rank of a multi-rank job (torchrun sets ``WORLD_SIZE``)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


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


def run_rank(
    settings: Settings, exit_when_idle_s: float | None, max_events: int | None
) -> tuple[RunSummary, dict[str, float]]:
    """Body of one rank (see the module docstring); returns its summary and
    :func:`step_stats`."""
    bind_rank_to_launcher()  # dies with torchrun's agent and the launcher (pipeline.lifetime)
    if settings.model.quantize is not QuantDtype.FP32 or settings.model.compile:
        raise ValueError(
            "model.quantize and model.compile apply to single-process serving; TorchRec's "
            "quantized tables shard only within one process (shard_quant_model). Use "
            "--nproc 1 with them, or fp32 without compile for several ranks."
        )
    device = join_process_group()  # cuda:{LOCAL_RANK} + NCCL with GPUs, else cpu + gloo
    rank, world_size = dist.get_rank(), dist.get_world_size()
    # The per-step agreement runs on the loop's thread while the forward's collectives run on
    # the scoring thread: separate groups keep their message orders apart (and, with NCCL,
    # control traffic on the CPU).
    control = dist.new_group(backend="gloo")
    checkpoint = settings.model.checkpoint
    meta = load_meta(checkpoint)
    spec = meta.spec
    plan = plan_sharding(
        spec,
        world_size,
        device.type,
        settings.model.sharding.to_config(),
        batch_rows=settings.batching.max_batch_rows,
    )
    if rank == 0:
        log.info("sharding plan:\n%s", describe_plan(plan, spec, world_size).render())
    dmp = shard_ranker(spec, plan, device)
    loaded = load_sharded(dmp, checkpoint)
    metrics = Metrics()
    held = embedding_bytes(dmp)
    metrics.embedding_bytes.set(held)
    log.info(
        "rank %d/%d on %s holds %.1f MiB of embeddings; model %s",
        rank,
        world_size,
        device,
        held / 2**20,
        loaded.model_version,
    )
    degradations = int(os.environ.get(DEGRADATIONS_ENV, "0"))
    if degradations and rank == 0:
        log.warning(
            "running on %d ranks after %d degradation(s) (streamrank_degradations)",
            world_size,
            degradations,
        )
    if settings.metrics.enabled:
        port = settings.metrics.port + rank if settings.metrics.port else 0
        metrics.serve(settings.metrics.host, port)
    scorer = Scorer(dmp, spec, loaded.model_version, device)
    pipeline = ScoringPipeline(
        settings, scorer, metrics, stepper=CollectiveStepper(control, metrics=metrics)
    )
    pipeline.stop_on_signals()
    arm_test_crash(rank, world_size)
    try:
        summary = pipeline.run(exit_when_idle_s=exit_when_idle_s, max_events=max_events)
        return summary, step_stats(metrics)
    finally:
        dist.destroy_process_group()


def summary_path(path: Path | None) -> Path | None:
    """Per-rank summary file: ``run.json`` -> ``run.rank1.json`` (rank 0 keeps the name)."""
    if path is None or not in_torchrun():
        return path
    rank = int(os.environ.get("RANK", "0"))
    return path if rank == 0 else path.with_suffix(f".rank{rank}{path.suffix}")
