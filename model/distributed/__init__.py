"""Sharding the ranker's embedding tables across ranks with TorchRec ``DistributedModelParallel``.

Modules, mirroring TorchRec's ``distributed`` package (each usable on its own):

- :mod:`model.distributed.config`: :class:`ShardingConfig` and friends (plain dataclasses and
  string enums; no torch or TorchRec import, so configuration loading can use them).
- :mod:`model.distributed.planner`: :func:`plan_sharding`, a config -> a TorchRec
  ``ShardingPlan``, without a process group.
- :mod:`model.distributed.report`: :func:`describe_plan`, which rank holds what, in bytes.
- :mod:`model.distributed.process_group`: :func:`join_process_group`, the one way to join;
  :func:`local_world_size`, ranks per host.
- :mod:`model.distributed.runtime`: :func:`shard_ranker` (``DistributedModelParallel``) and
  :func:`load_unsharded_state_dict`.
- :mod:`model.distributed.checkpoint`: sharded checkpoints (``torch.distributed.checkpoint``).

The names below are re-exported lazily (on first attribute access), so importing
``model.distributed.config`` does not import ``torchrec.distributed``.

Example::

    from model.distributed import (
        join_process_group, local_world_size, plan_sharding, shard_ranker
    )

    device = join_process_group()  # under torchrun
    world = dist.get_world_size()
    plan = plan_sharding(
        spec, world, device.type, ShardingConfig(), local_world_size=local_world_size(world)
    )
    dmp = shard_ranker(spec, plan, device)
    probs = score_probabilities(dmp, inp.to(device))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from model.lazy import lazy_exports

if TYPE_CHECKING:
    from model.distributed.checkpoint import (
        DCP_INDEX_FILE,
        WEIGHTS_FORMAT_DCP,
        checkpoint_format,
        export_unsharded,
        load_ranker,
        load_sharded,
        save_sharded,
    )
    from model.distributed.config import (
        Balance,
        ComputeKernel,
        ShardingConfig,
        ShardingKind,
        TableShardingConfig,
    )
    from model.distributed.planner import EBC_MODULE_PATH, plan_sharding
    from model.distributed.process_group import (
        default_backend,
        join_process_group,
        local_world_size,
    )
    from model.distributed.report import PlanReport, RankBytes, TablePlacement, describe_plan
    from model.distributed.runtime import (
        load_unsharded_state_dict,
        make_sharder,
        shard_module,
        shard_ranker,
    )

EXPORTS: dict[str, tuple[str, ...]] = {
    "checkpoint": (
        "DCP_INDEX_FILE",
        "WEIGHTS_FORMAT_DCP",
        "checkpoint_format",
        "export_unsharded",
        "load_ranker",
        "load_sharded",
        "save_sharded",
    ),
    "config": (
        "Balance",
        "ComputeKernel",
        "ShardingConfig",
        "ShardingKind",
        "TableShardingConfig",
    ),
    "planner": ("EBC_MODULE_PATH", "plan_sharding"),
    "process_group": ("default_backend", "join_process_group", "local_world_size"),
    "report": ("PlanReport", "RankBytes", "TablePlacement", "describe_plan"),
    "runtime": ("load_unsharded_state_dict", "make_sharder", "shard_module", "shard_ranker"),
}
"""For each submodule, the names the package re-exports from it."""

__all__, __getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
