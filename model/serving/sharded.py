"""Serving sharded across ranks: join the process group, plan the tables, wrap the ranker in
``DistributedModelParallel`` and load the checkpoint's shards (strategy of
:class:`~model.serving.factory.ScorerFactory`).

Every rank runs this together (the sharding and loading are collective).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from model.distributed import (
    describe_plan,
    join_process_group,
    load_sharded,
    plan_sharding,
    shard_ranker,
)
from model.rank import RankContext
from model.serving.memory import embedding_bytes
from model.serving.options import ServingOptions
from model.store.checkpoint import CheckpointMeta, load_meta

__all__ = ["load_sharded_model"]

log = logging.getLogger(__name__)


def load_sharded_model(
    options: ServingOptions, device: torch.device, rank: RankContext
) -> tuple[nn.Module, CheckpointMeta]:
    """This rank's part of the model, sharded across the job's ranks.

    Args:
        options: checkpoint, sharding and batch size (the planner's input).
        device: this rank's device (``cuda:{local_rank}`` + NCCL, or ``cpu`` + gloo).
        rank: this rank's place in the job.

    Returns:
        The ``DistributedModelParallel`` module and the checkpoint's metadata.

    Example::

        dmp, meta = load_sharded_model(options, torch.device("cpu"), RankContext.from_env())
    """
    join_process_group(
        rank.rank,
        rank.world_size,
        rank.local_rank,
        backend="nccl" if device.type == "cuda" else "gloo",
    )
    spec = load_meta(options.checkpoint).spec
    plan = plan_sharding(  # shards land on cuda:{rank % local_world_size} = this rank's GPU
        spec,
        rank.world_size,
        device.type,
        options.sharding,
        batch_rows=options.batch_rows,
        local_world_size=rank.local_world_size,
    )
    if rank.rank == 0:
        log.info("sharding plan:\n%s", describe_plan(plan, spec, rank.world_size).render())
    dmp = shard_ranker(spec, plan, device)
    meta = load_sharded(dmp, options.checkpoint)
    log.info(
        "rank %d/%d on %s holds %.1f MiB of embeddings; model %s",
        rank.rank,
        rank.world_size,
        device,
        embedding_bytes(dmp) / 2**20,
        meta.model_version,
    )
    return dmp, meta
