"""Running sharded: wrap the ranker in ``DistributedModelParallel`` and load unsharded weights.

Every rank calls :func:`shard_ranker` (collective) inside an initialised process group
(:func:`model.distributed.process_group.join_process_group`); weights come from
:func:`load_unsharded_state_dict` (an unsharded ``Ranker.state_dict()``: each rank keeps the
slices it owns) or :mod:`model.distributed.checkpoint`.

Running the sharded model: every rank calls
:func:`model.serving.inference.score_probabilities` (``dmp(dense, sparse)`` under
``torch.no_grad()``) with its *own* local batch at the same time (the embedding lookups are
collectives: a rank with nothing to score must still call it, with an empty batch); each rank gets
back the scores of its own rows. Ranks may feed different row counts, including zero (checked on
gloo for every sharding type here); padding to a fixed size keeps shapes stable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import (
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ShardingEnv,
    ShardingPlan,
)

from model.features.spec import FeatureSpec
from model.ranker import Ranker, build_ranker
from model.serving.memory import embedding_bytes

__all__ = [
    "load_unsharded_state_dict",
    "make_sequence_sharder",
    "make_sharder",
    "shard_module",
    "shard_ranker",
    "sharders",
]

_log = logging.getLogger(__name__)


def make_sharder(fused_params: dict[str, Any] | None = None) -> EmbeddingBagCollectionSharder:
    """The ``EmbeddingBagCollection`` sharder used for planning and sharding.

    Args:
        fused_params: extra FBGEMM kernel parameters (none are needed on CPU or CUDA for
            inference; the fused kernel's default optimizer is SGD, unused without backward).

    Returns:
        A fresh sharder.
    """
    return EmbeddingBagCollectionSharder(fused_params=fused_params)


def make_sequence_sharder(
    fused_params: dict[str, Any] | None = None,
) -> EmbeddingCollectionSharder:
    """The ``EmbeddingCollection`` sharder (sequence tables), as :func:`make_sharder`."""
    return EmbeddingCollectionSharder(fused_params=fused_params)


def sharders(fused_params: dict[str, Any] | None = None) -> list[ModuleSharder[nn.Module]]:
    """The sharders ``DistributedModelParallel`` and the planner take: pooled tables
    (:func:`make_sharder`) and sequence tables (:func:`make_sequence_sharder`).

    Args:
        fused_params: see :func:`make_sharder`.

    Returns:
        ``[make_sharder(fused_params), make_sequence_sharder(fused_params)]``.
    """
    return [
        cast(ModuleSharder[nn.Module], make_sharder(fused_params)),
        cast(ModuleSharder[nn.Module], make_sequence_sharder(fused_params)),
    ]


def shard_ranker(
    ranker_or_spec: Ranker | FeatureSpec,
    plan: ShardingPlan,
    device: torch.device | str,
    pg: dist.ProcessGroup | None = None,
    *,
    seed: int | None = 0,
    init_data_parallel: bool = True,
    fused_params: dict[str, Any] | None = None,
) -> DistributedModelParallel:
    """Wrap the ranker in ``DistributedModelParallel`` according to ``plan`` (collective).

    Every rank of the process group must call this with the same plan. With a spec, a
    meta-device ranker is built (dense layers from ``seed``; ``init_data_parallel`` also
    broadcasts them from rank 0) and the tables are allocated per shard with random values:
    load real weights afterwards (:func:`load_unsharded_state_dict` or
    :func:`model.distributed.checkpoint.load_sharded`). With a ranker whose tables are
    materialised, its weights are loaded into the sharded model (every rank must pass the same
    weights); a meta-device ranker is sharded in place.

    Args:
        ranker_or_spec: the model or its spec.
        plan: a plan for this process group's world size (from :func:`plan_sharding`).
        device: this rank's device (``cpu`` or ``cuda:<local_rank>``).
        pg: the process group; default the global one.
        seed: initialisation seed of the dense layers when building from a spec.
        init_data_parallel: wrap the dense part in DDP (syncs it from rank 0).
        fused_params: see :func:`make_sharder`.

    Returns:
        The sharded model in eval mode; ``dmp.module`` is the :class:`~model.ranker.Ranker`.

    Raises:
        RuntimeError: if no process group is initialised.
        ValueError: if the plan was made for another device type than ``device``'s.

    Example::

        dmp = shard_ranker(spec, plan_sharding(spec, world), device)
        load_unsharded_state_dict(dmp, state)
        probs = score_probabilities(dmp, inp.to(device))
    """
    if pg is None and not dist.is_initialized():
        raise RuntimeError("shard_ranker needs an initialised process group")
    dev = torch.device(device)
    planned_types = _plan_device_types(plan)
    if planned_types - {dev.type}:
        raise ValueError(
            f"plan places shards on {sorted(planned_types)} but this rank's device is {dev}; "
            f"plan with device_type={dev.type!r}"
        )
    state: dict[str, torch.Tensor] | None = None
    if isinstance(ranker_or_spec, Ranker):
        ranker = ranker_or_spec
        if not any(p.is_meta for p in ranker.embedding_bag_collection.parameters()):
            state = {k: v.detach() for k, v in ranker.state_dict().items()}
            ranker = build_ranker(ranker.spec, device=dev, seed=seed, embedding_device="meta")
        else:
            dense = [p for p in ranker.parameters() if not p.is_meta]
            if any(p.device != dev for p in dense):
                raise ValueError(
                    f"the meta-table ranker's dense layers are not on {dev}; build it with "
                    f"build_ranker(spec, device={str(dev)!r}, embedding_device='meta')"
                )
    else:
        ranker = build_ranker(ranker_or_spec, device=dev, seed=seed, embedding_device="meta")
    dmp = shard_module(
        ranker, plan, dev, pg, init_data_parallel=init_data_parallel, fused_params=fused_params
    )
    if state is not None:
        load_unsharded_state_dict(dmp, state)
    return dmp


def shard_module(
    module: nn.Module,
    plan: ShardingPlan,
    device: torch.device | str,
    pg: dist.ProcessGroup | None = None,
    *,
    init_data_parallel: bool = True,
    fused_params: dict[str, Any] | None = None,
) -> DistributedModelParallel:
    """Wrap any module whose tables are on the ``meta`` device in ``DistributedModelParallel``
    (collective: every rank calls it with the same plan).

    Args:
        module: e.g. :func:`model.module.factory.build_module` with ``embedding_device="meta"``
            (its dense layers already on ``device``).
        plan: a plan for its tables (:func:`model.distributed.planner.plan_sharding` of
            :func:`model.module.checks.module_tables`).
        device: this rank's device.
        pg: the process group; default the global one.
        init_data_parallel: wrap the dense part in DDP (syncs it from rank 0).
        fused_params: see :func:`make_sharder`.

    Returns:
        The sharded model in eval mode; load weights into it afterwards (its load hooks copy
        the slices each rank owns).

    Example::

        dmp = shard_module(build_module(config, device, embedding_device="meta"), plan, device)
    """
    if pg is None and not dist.is_initialized():
        raise RuntimeError("shard_module needs an initialised process group")
    dev = torch.device(device)
    env = ShardingEnv.from_process_group(pg) if pg is not None else None
    dmp = DistributedModelParallel(
        module=module,
        env=env,
        device=dev,
        plan=plan,
        sharders=sharders(fused_params),
        init_data_parallel=init_data_parallel,
    )
    dmp.eval()
    nbytes = embedding_bytes(dmp)
    _log.info(
        "sharded module: rank %d holds %d embedding bytes (%.1f MiB)",
        dist.get_rank(pg),
        nbytes,
        nbytes / 2**20,
    )
    return dmp


def _plan_device_types(plan: ShardingPlan) -> set[str]:
    types: set[str] = set()
    for module_plan in plan.plan.values():
        if not isinstance(module_plan, EmbeddingModuleShardingPlan):
            continue
        for ps in module_plan.values():
            if ps.sharding_spec is None:
                continue
            for shard in ps.sharding_spec.shards:
                if shard.placement is not None:
                    types.add(shard.placement.device().type)
    return types


def load_unsharded_state_dict(
    dmp: DistributedModelParallel, state_dict: Mapping[str, torch.Tensor], strict: bool = True
) -> None:
    """Load an unsharded ``Ranker.state_dict()`` into the sharded model (no collectives).

    Each rank copies the slices of every table that it owns; dense layers are copied whole.

    Args:
        dmp: from :func:`shard_ranker`.
        state_dict: e.g. :func:`model.store.checkpoint.load_state_dict`'s result (any device).
        strict: require exactly the ranker's keys.

    Raises:
        ValueError: on missing or unexpected keys (when ``strict``) or shape mismatches.

    Example::

        load_unsharded_state_dict(dmp, load_state_dict("artifacts/ckpt"))
    """
    try:
        result = dmp.load_state_dict(dict(state_dict), strict=strict)
    except RuntimeError as exc:
        raise ValueError(f"state dict does not fit the sharded ranker: {exc}") from exc
    if strict and (result.missing_keys or result.unexpected_keys):
        raise ValueError(
            f"state dict does not fit the sharded ranker: missing {result.missing_keys}, "
            f"unexpected {result.unexpected_keys}"
        )
