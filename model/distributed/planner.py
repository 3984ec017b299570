"""Planning: a :class:`~model.distributed.config.ShardingConfig` -> a TorchRec ``ShardingPlan``.

:func:`plan_sharding` needs no process group (``streamrank plan --nproc N`` prints a plan
without starting anything): tables the ``EmbeddingShardingPlanner`` can place are planned by it
on a meta-device collection, the others are built by hand with
:mod:`torchrec.distributed.sharding_plan`'s generators.

What works on CPU (gloo): the planner offers only ``fused`` for table-wise, column-wise and
table-column-wise and ``dense`` for data-parallel; it rejects row-wise and table-row-wise
("No available sharding type and compute kernel combination after applying user provided
constraints"; the sharder offers RW/TWRW only for CUDA). Those tables, column-wise tables (the
planner keeps them in one column shard), and any table with explicit ``ranks`` or a kernel the
planner does not offer are planned by hand, which works with gloo for every type here.
Table-wise tables are placed by hand too unless asked otherwise (``balance="planner"``): the
planner's perf-model placement ignores memory balance (default spec, 2 ranks: 75% of the bytes
on rank 0, against 50% when balancing bytes). With ``balance="split"`` (the default) they are
placed last, by :func:`model.distributed.balance.split_placement`, around the load of the
others: bytes and lookup work balanced, tables larger than their share split over all ranks.

Sequence tables (an ``EmbeddingCollection``'s) are always placed by hand, with the
``EmbeddingCollectionSharder``: table-wise, column-wise or row-wise (fused), which all serve
on gloo; data-parallel ones fail in TorchRec 1.8 when the KJT holds other keys, and the
table-row/column kinds are not offered (:data:`~model.distributed.config.SEQUENCE_SHARDING`).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator, Mapping
from typing import cast

import torch
from torch import nn
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import (
    ParameterShardingGenerator,
    column_wise,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from torchrec.distributed.types import (
    EmbeddingModuleShardingPlan,
    ModuleSharder,
    ParameterSharding,
    ShardingPlan,
    ShardingType,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from model.distributed.balance import split_kind, split_placement
from model.distributed.config import (
    SEQUENCE_SHARDING,
    Balance,
    ComputeKernel,
    ShardingConfig,
    ShardingKind,
    TableShardingConfig,
)
from model.distributed.cost import FP32_BYTES, Tables, as_tables, shard_loads
from model.distributed.runtime import make_sequence_sharder, make_sharder, sharders
from model.features.spec import BUILTIN_COLLECTION_PATH
from model.module.factory import embedding_bag_configs, embedding_configs
from model.module.types import TableConfig

__all__ = ["EBC_MODULE_PATH", "FP32_BYTES", "plan_sharding"]

#: Path of the ranker's ``EmbeddingBagCollection`` inside :class:`~model.ranker.Ranker`; the key
#: of its entry in a ``ShardingPlan`` (another module's collections sit at their own paths:
#: :attr:`~model.module.types.TableConfig.module_path`).
EBC_MODULE_PATH = BUILTIN_COLLECTION_PATH

# (sharding kind, compute kernel) pairs left to the planner per compute device; anything else
# is planned by hand. Column-wise is always planned by hand: the planner kept the default
# spec's dim-64 tables in a single column shard (i.e. table-wise), which defeats the point.
_PLANNER_OFFERS: dict[str, frozenset[tuple[ShardingKind, ComputeKernel]]] = {
    "cpu": frozenset(
        {
            (ShardingKind.TABLE_WISE, ComputeKernel.FUSED),
            (ShardingKind.TABLE_COLUMN_WISE, ComputeKernel.FUSED),
            (ShardingKind.DATA_PARALLEL, ComputeKernel.DENSE),
        }
    ),
    "cuda": frozenset(
        {
            (kind, ComputeKernel.FUSED)
            for kind in ShardingKind
            if kind not in (ShardingKind.DATA_PARALLEL, ShardingKind.COLUMN_WISE)
        }
        | {(ShardingKind.DATA_PARALLEL, ComputeKernel.DENSE)}
    ),
}


@contextlib.contextmanager
def _quiet_planner() -> Iterator[None]:
    """Silence the planner's advisory warnings (topology construction, storage heuristics)."""
    names = (
        "",  # the planner logs "Sharding spec not found for ..." on the root logger
        "torchrec.distributed.planner",
        "torchrec.distributed.planner.types",
        "torchrec.distributed.planner.storage_reservations",
        "torchrec.distributed.planner.stats",
    )
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def plan_sharding(
    model_tables: Tables,
    world_size: int,
    device_type: str = "cpu",
    config: ShardingConfig | None = None,
    max_batch_rows: int = 4096,
    local_world_size: int | None = None,
) -> ShardingPlan:
    """A ``ShardingPlan`` for a model's tables, without a process group.

    Who places what:

    - ``EmbeddingShardingPlanner`` (``Topology(world_size, device_type)``,
      ``ParameterConstraints`` from ``config``, a meta-device collection of just these tables):
      tables without explicit ranks whose (sharding type, kernel) it offers on ``device_type``
      (module docstring), except column-wise ones and, with ``config.balance == "bytes"`` (the
      default), table-wise ones; i.e. data-parallel and table-column-wise on CPU, plus
      row-wise and table-row-wise on CUDA.
    - by hand, with TorchRec's plan generators, all others, largest table first: table-wise
      tables go to the rank holding the fewest bytes so far, column-wise shards to the
      least-loaded ranks (as many as divide the embedding dim, up to ``world_size``; ties:
      lowest rank), row-wise spreads rows over all ranks, table-row-wise over the ranks of
      host 0 (all ranks: one host).
    - with ``config.balance == "split"`` (the default), table-wise tables without explicit
      ranks last, by :func:`~model.distributed.balance.split_placement` (whole on one rank,
      or split over all ranks column-wise / row-wise, fused kernel unless configured), so
      that bytes and lookup work per rank (:mod:`model.distributed.cost`) stay within 1.1x
      of the ideal where splitting can get there.

    Args:
        model_tables: the built-in spec, or any module's tables
            (:func:`model.module.checks.module_tables`: sizes, dims, ids per row, paths).
        world_size: number of ranks.
        device_type: ``"cpu"`` or ``"cuda"``.
        config: per-table sharding; default: every table table-wise, automatic kernel.
        max_batch_rows: rows per rank and batch (``batching.max_batch_rows``), the planner's
            cost-model batch size.
        local_world_size: ranks per host (default ``world_size``: one host); sets the CUDA
            device index of each rank (``rank % local_world_size``) and table-row-wise groups.

    Returns:
        A plan with one entry per collection path (the built-in ranker's:
        :data:`EBC_MODULE_PATH`).

    Raises:
        ValueError: on a bad world size or device type, unknown tables in ``config``, ranks
            outside the world, a column split that does not divide the embedding dim, or a
            planner failure (its message is kept).

    Example::

        plan = plan_sharding(FeatureSpec(), 2)
        print(describe_plan(plan, FeatureSpec(), 2).render())
        plan = plan_sharding(module_tables(module), 2)     # any module's own tables
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if device_type not in _PLANNER_OFFERS:
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    local_size = world_size if local_world_size is None else local_world_size
    if local_size < 1 or world_size % local_size:
        raise ValueError(
            f"local_world_size must divide world_size {world_size}, got {local_world_size}"
        )
    cfg = config if config is not None else ShardingConfig()
    tables = as_tables(model_tables)
    cfg.check(tables)
    by_name = {t.name: t for t in tables}
    table_cfg = {t.name: cfg.for_table(t) for t in tables}
    for name, tc in table_cfg.items():
        if tc.ranks is not None and max(tc.ranks) >= world_size:
            raise ValueError(f"table {name}: ranks {tc.ranks} outside world_size {world_size}")
        if by_name[name].sequence and tc.sharding_type not in SEQUENCE_SHARDING:
            raise ValueError(
                f"sequence table {name} cannot be {tc.sharding_type.value}: an "
                "EmbeddingCollection shards table_wise, column_wise or row_wise here"
            )
    offers = _PLANNER_OFFERS[device_type]
    auto = [
        n
        for n, tc in table_cfg.items()
        if cfg.balance is Balance.SPLIT
        and tc.sharding_type is ShardingKind.TABLE_WISE
        and tc.ranks is None
    ]
    planned = [
        n
        for n, tc in table_cfg.items()
        if tc.ranks is None
        and not by_name[n].sequence  # the planner is given the pooled collection only
        and n not in auto
        and (tc.sharding_type, tc.kernel) in offers
        and not (cfg.balance is Balance.BYTES and tc.sharding_type is ShardingKind.TABLE_WISE)
    ]
    by_hand = [n for n in table_cfg if n not in planned and n not in auto]

    result = EmbeddingModuleShardingPlan()
    if planned:
        chosen = [by_name[n] for n in planned]
        result.update(
            _run_planner(chosen, table_cfg, world_size, local_size, device_type, max_batch_rows)
        )
    load = [0] * world_size
    work = [0.0] * world_size
    by_hand_tables = [t for t in tables if t.name not in planned]
    meta_ebc = EmbeddingBagCollection(tables=embedding_bag_configs(by_hand_tables), device="meta")
    bag_sharder, sequence_sharder = make_sharder(), make_sequence_sharder()
    params = bag_sharder.shardable_parameters(meta_ebc)
    sequence = embedding_configs(by_hand_tables)
    if sequence:
        meta_ec = EmbeddingCollection(tables=sequence, device=torch.device("meta"))
        params.update(sequence_sharder.shardable_parameters(meta_ec))

    def account(name: str, ps: ParameterSharding) -> None:
        result[name] = ps
        for shard in shard_loads(ps, by_name[name], world_size):
            load[shard.rank] += shard.bytes
            work[shard.rank] += shard.work

    def place(name: str, gen: ParameterShardingGenerator) -> None:
        chosen = sequence_sharder if by_name[name].sequence else bag_sharder
        module_sharder = cast(ModuleSharder[nn.Module], chosen)
        account(name, gen(params[name], local_size, world_size, device_type, module_sharder))

    for name, ps in list(result.items()):
        account(name, ps)
    # Biggest tables first, so the greedy balancer places them while ranks are still empty.
    for name in sorted(by_hand, key=lambda n: -by_name[n].num_embeddings):
        tc, table = table_cfg[name], by_name[name]
        place(name, _hand_generator(tc, table, table.embedding_dim, world_size, load))
    if auto:  # last: the loads of the others are the base the split placement balances around
        placed = split_placement([by_name[n] for n in auto], world_size, load, work)
        for name in auto:
            kernel = table_cfg[name].kernel.value
            kind = split_kind(by_name[name].embedding_dim, world_size)
            if name in placed.whole:
                place(name, table_wise(rank=placed.whole[name], compute_kernel=kernel))
            elif kind is ShardingKind.COLUMN_WISE:
                place(name, column_wise(ranks=list(range(world_size)), compute_kernel=kernel))
            else:
                place(name, row_wise(compute_kernel=kernel))
    paths: dict[str, EmbeddingModuleShardingPlan] = {}
    for t in tables:
        paths.setdefault(t.module_path, EmbeddingModuleShardingPlan())[t.name] = result[t.name]
    return ShardingPlan(dict(paths))


def _run_planner(
    chosen: list[TableConfig],
    table_cfg: Mapping[str, TableShardingConfig],
    world_size: int,
    local_size: int,
    device_type: str,
    max_batch_rows: int,
) -> EmbeddingModuleShardingPlan:
    names = [t.name for t in chosen]
    ebc = EmbeddingBagCollection(tables=embedding_bag_configs(chosen), device="meta")
    constraints = {
        n: ParameterConstraints(
            sharding_types=[ShardingType(table_cfg[n].sharding_type.value).value],
            compute_kernels=[table_cfg[n].kernel.value],
        )
        for n in names
    }
    with _quiet_planner():
        topology = Topology(
            world_size=world_size, compute_device=device_type, local_world_size=local_size
        )
        planner = EmbeddingShardingPlanner(
            topology=topology, batch_size=max_batch_rows, constraints=constraints, debug=False
        )
        try:
            plan = planner.plan(ebc, sharders())
        except Exception as exc:  # PlannerError and friends: keep the planner's reason
            raise ValueError(f"sharding planner failed: {exc}") from exc
    module_plan = plan.plan.get("")
    if not isinstance(module_plan, EmbeddingModuleShardingPlan):
        raise ValueError(f"sharding planner returned no plan for the tables: {plan}")
    return module_plan


def _hand_generator(
    tc: TableShardingConfig,
    table: TableConfig,
    dim: int,
    world_size: int,
    load: list[int],
) -> ParameterShardingGenerator:
    kind, kernel = tc.sharding_type, tc.kernel.value

    def least_loaded(k: int) -> list[int]:
        return sorted(sorted(range(world_size), key=lambda r: (load[r], r))[:k])

    if kind is ShardingKind.TABLE_WISE:
        rank = tc.ranks[0] if tc.ranks is not None else least_loaded(1)[0]
        return table_wise(rank=rank, compute_kernel=kernel)
    if kind is ShardingKind.COLUMN_WISE:
        if tc.ranks is not None:
            ranks = list(tc.ranks)
        else:
            shards = max(k for k in range(1, min(world_size, dim) + 1) if dim % k == 0)
            ranks = least_loaded(shards)
        if dim % len(ranks):
            raise ValueError(
                f"table {table.name}: embedding_dim {dim} does not split evenly over "
                f"{len(ranks)} column shards ({ranks})"
            )
        return column_wise(ranks=ranks, compute_kernel=kernel)
    if kind is ShardingKind.ROW_WISE:
        return row_wise(compute_kernel=kernel)
    if kind is ShardingKind.DATA_PARALLEL:
        return data_parallel()
    if kind is ShardingKind.TABLE_ROW_WISE:
        return _with_kernel(table_row_wise(host_index=0), kernel)
    raise ValueError(f"table {table.name}: {kind.value} can only be planned by the planner")


def _with_kernel(gen: ParameterShardingGenerator, kernel: str) -> ParameterShardingGenerator:
    def wrapped(
        param: nn.Parameter,
        local_size: int,
        world_size: int,
        device_type: str,
        sharder: ModuleSharder[nn.Module],
    ) -> ParameterSharding:
        ps = gen(param, local_size, world_size, device_type, sharder)
        ps.compute_kernel = kernel
        return ps

    return wrapped
