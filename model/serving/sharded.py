"""Serving sharded across ranks: join the process group, build the module with its tables on
the ``meta`` device, plan its own tables, wrap it in ``DistributedModelParallel`` and load the
weights' shards (strategy of :class:`~model.serving.factory.ScorerFactory`).

Every rank runs this together (the sharding and loading are collective). The planner reads the
module's own collections (:func:`model.module.checks.module_tables`), so any module the
contract serves shards the same way as the built-in ranker.
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
    shard_module,
)
from model.module.checks import managed_collisions, module_tables
from model.module.factory import build_module
from model.rank import RankContext
from model.serving.memory import embedding_bytes
from model.serving.options import ServingOptions, UnsupportedOption
from model.serving.served import ServedModule, load_weights

__all__ = ["load_sharded_model"]

log = logging.getLogger(__name__)


def load_sharded_model(
    options: ServingOptions, served: ServedModule, device: torch.device, rank: RankContext
) -> nn.Module:
    """This rank's part of the module, sharded across the job's ranks.

    Args:
        options: checkpoint, sharding and batch size (the planner's input).
        served: what the checkpoint holds (:func:`model.serving.served.describe_served`).
        device: this rank's device (``cuda:{local_rank}`` + NCCL, or ``cpu`` + gloo).
        rank: this rank's place in the job.

    Returns:
        The ``DistributedModelParallel`` module.

    Example::

        dmp = load_sharded_model(options, describe_served(options), device, rank)
    """
    join_process_group(
        rank.rank,
        rank.world_size,
        rank.local_rank,
        backend="nccl" if device.type == "cuda" else "gloo",
    )
    layout = served.layout
    probe = build_module(served.config, "meta", embedding_device="meta")  # wholly on meta
    if managed_collisions(probe):  # one the factory built itself: no config says so
        raise UnsupportedOption(
            f"model.module: {managed_collisions(probe)[0]} is a managed-collision collection, "
            "which serves in one process only (see model.module.managed_collision); use "
            "--nproc 1"
        )
    tables = module_tables(probe, dict(zip(layout.keys, layout.ids_per_key, strict=True)))
    plan = plan_sharding(  # shards land on cuda:{rank % local_world_size} = this rank's GPU
        tables,
        rank.world_size,
        device.type,
        options.sharding,
        max_batch_rows=options.max_batch_rows,
        local_world_size=rank.local_world_size,
    )
    if rank.rank == 0:
        log.info("sharding plan:\n%s", describe_plan(plan, tables, rank.world_size).render())
    module = build_module(served.config, device, embedding_device="meta", seed=0)
    dmp = shard_module(module, plan, device)
    if served.spec is not None:
        load_sharded(dmp, options.checkpoint)  # either format (DCP or model.pt)
    else:
        load_weights(dmp, served, options.checkpoint)
    log.info(
        "rank %d/%d on %s holds %.1f MiB of embeddings; model %s",
        rank.rank,
        rank.world_size,
        device,
        embedding_bytes(dmp) / 2**20,
        served.model_version,
    )
    return dmp
