"""Sharding the ranker's embedding tables across ranks with TorchRec ``DistributedModelParallel``.

Three steps, each usable on its own:

1. :func:`plan_sharding` turns a :class:`ShardingConfig` (a sharding type, and optionally a
   compute kernel and ranks, per table) into a TorchRec ``ShardingPlan``. It needs no process
   group (``streamrank plan --nproc N`` prints a plan without starting anything): tables the
   ``EmbeddingShardingPlanner`` can place are planned by it on a meta-device collection, the
   others are built by hand with :mod:`torchrec.distributed.sharding_plan`'s generators.
2. :func:`describe_plan` reports which rank holds which part of which table and how many fp32
   bytes each rank holds (:class:`PlanReport`).
3. :func:`shard_ranker` wraps a (meta-device) :class:`~model.ranker.Ranker` in
   ``DistributedModelParallel`` inside an initialised process group; weights come from
   :func:`load_unsharded_state_dict` (an unsharded ``Ranker.state_dict()``: each rank keeps
   the slices it owns) or :mod:`model.distributed_checkpoint`.

What works on CPU (gloo): the planner offers only ``fused`` for table-wise, column-wise and
table-column-wise and ``dense`` for data-parallel; it rejects row-wise and table-row-wise
("No available sharding type and compute kernel combination after applying user provided
constraints"; the sharder offers RW/TWRW only for CUDA). Those tables, column-wise tables (the
planner keeps them in one column shard), and any table with explicit ``ranks`` or a kernel the
planner does not offer are planned by hand, which works with gloo for every type here.
Table-wise tables are placed by hand too unless asked otherwise (``balance="planner"``): the
planner's perf-model placement ignores memory balance (default spec, 2 ranks: 75% of the bytes
on rank 0, against 50% when balancing bytes).

Running the sharded model: every rank calls ``dmp(dense, sparse)`` with its *own* local batch
at the same time (the embedding lookups are collectives: a rank with nothing to score must
still call it, with an empty batch); each rank gets back the logits of its own rows. Ranks may
feed different row counts, including zero (checked on gloo for every sharding type here);
padding to a fixed size (:func:`model.features.pad_model_input`) keeps shapes stable. Run the
forward under ``torch.no_grad()`` (see :func:`sharded_scores`): under ``torch.inference_mode()``
the fused CPU kernel fails ("Could not run 'fbgemm::split_embedding_codegen_lookup_sgd_
function_pt2' with arguments from the 'CPU' backend").
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
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
    ShardingEnv,
    ShardingPlan,
    ShardingType,
)
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from model.features import ModelInput
from model.ranker import Ranker, build_ranker, embedding_bag_configs
from model.spec import FeatureSpec, TableSpec

__all__ = [
    "EBC_MODULE_PATH",
    "Balance",
    "PlanReport",
    "RankBytes",
    "ShardingConfig",
    "ShardingKind",
    "TablePlacement",
    "TableShardingConfig",
    "default_backend",
    "describe_plan",
    "init_distributed",
    "load_unsharded_state_dict",
    "local_embedding_bytes",
    "make_sharder",
    "plan_sharding",
    "rank_device",
    "shard_ranker",
    "sharded_scores",
]

_log = logging.getLogger(__name__)

#: Path of the ranker's ``EmbeddingBagCollection`` inside :class:`~model.ranker.Ranker`; the key
#: of its entry in a ``ShardingPlan``.
EBC_MODULE_PATH = "model.sparse_arch.embedding_bag_collection"

_FP32_BYTES = 4
_KERNELS = (EmbeddingComputeKernel.FUSED.value, EmbeddingComputeKernel.DENSE.value)


class Balance(enum.StrEnum):
    """Who places table-wise tables that have no explicit ranks."""

    #: Largest table first onto the rank holding the fewest bytes so far (memory balance).
    BYTES = "bytes"
    #: ``EmbeddingShardingPlanner``'s perf-model placement (it ignores memory balance on CPU:
    #: default spec on 2 ranks, 75% of the bytes on one rank).
    PLANNER = "planner"


class ShardingKind(enum.StrEnum):
    """How one table is split across ranks (values are TorchRec's ``ShardingType`` values)."""

    TABLE_WISE = "table_wise"
    ROW_WISE = "row_wise"
    COLUMN_WISE = "column_wise"
    DATA_PARALLEL = "data_parallel"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"


# (sharding kind, compute kernel) pairs left to the planner per compute device; anything else
# is planned by hand. Column-wise is always planned by hand: the planner kept the default
# spec's dim-64 tables in a single column shard (i.e. table-wise), which defeats the point.
_PLANNER_OFFERS: dict[str, frozenset[tuple[ShardingKind, str]]] = {
    "cpu": frozenset(
        {
            (ShardingKind.TABLE_WISE, "fused"),
            (ShardingKind.TABLE_COLUMN_WISE, "fused"),
            (ShardingKind.DATA_PARALLEL, "dense"),
        }
    ),
    "cuda": frozenset(
        {
            (kind, "fused")
            for kind in ShardingKind
            if kind not in (ShardingKind.DATA_PARALLEL, ShardingKind.COLUMN_WISE)
        }
        | {(ShardingKind.DATA_PARALLEL, "dense")}
    ),
}


@dataclass(frozen=True)
class TableShardingConfig:
    """Sharding of one table.

    Args:
        sharding_type: a :class:`ShardingKind` (or its string value).
        compute_kernel: ``"fused"`` (FBGEMM table-batched kernel), ``"dense"``, or ``None``
            for automatic: ``dense`` for data-parallel, else ``fused``.
        ranks: place the table (table-wise: exactly one rank) or its column shards
            (column-wise: one rank per shard; the embedding dim must divide evenly) explicitly;
            ``None`` lets the planner (or, for hand-built tables, a greedy byte balancer)
            choose. Only for table-wise and column-wise (row-wise always spreads rows over all
            ranks in rank order; data-parallel copies to all ranks).

    Example::

        TableShardingConfig("row_wise")
        TableShardingConfig(ShardingKind.COLUMN_WISE, compute_kernel="fused", ranks=(0, 1))
    """

    sharding_type: ShardingKind = ShardingKind.TABLE_WISE
    compute_kernel: str | None = None
    ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        try:
            kind = ShardingKind(self.sharding_type)
        except ValueError as exc:
            raise ValueError(
                f"unknown sharding type {self.sharding_type!r}; expected one of "
                f"{[k.value for k in ShardingKind]}"
            ) from exc
        object.__setattr__(self, "sharding_type", kind)
        if self.compute_kernel is not None and self.compute_kernel not in _KERNELS:
            raise ValueError(
                f"unknown compute kernel {self.compute_kernel!r}; expected one of "
                f"{list(_KERNELS)} or None"
            )
        if kind is ShardingKind.DATA_PARALLEL and self.compute_kernel == "fused":
            raise ValueError("data_parallel tables need the dense kernel, not fused")
        if self.ranks is not None:
            ranks = tuple(int(r) for r in self.ranks)
            object.__setattr__(self, "ranks", ranks)
            if kind not in (ShardingKind.TABLE_WISE, ShardingKind.COLUMN_WISE):
                raise ValueError(f"explicit ranks are not supported for {kind.value}")
            if not ranks or min(ranks) < 0:
                raise ValueError(f"ranks must be non-empty and >= 0, got {ranks}")
            if kind is ShardingKind.TABLE_WISE and len(ranks) != 1:
                raise ValueError(f"a table_wise table lives on exactly one rank, got {ranks}")

    @property
    def kernel(self) -> str:
        """The resolved compute kernel (``compute_kernel`` or the automatic choice)."""
        if self.compute_kernel is not None:
            return self.compute_kernel
        return "dense" if self.sharding_type is ShardingKind.DATA_PARALLEL else "fused"

    @classmethod
    def parse(cls, text: str) -> TableShardingConfig:
        """Parse ``KIND[:KERNEL][@R1+R2...]``, e.g. ``column_wise:fused@0+1`` or ``row_wise``.

        Args:
            text: the description.

        Returns:
            The config.

        Raises:
            ValueError: on an unknown kind or kernel, or bad ranks.

        Example::

            TableShardingConfig.parse("table_wise@1")  # table-wise on rank 1
        """
        body, _, ranks_text = text.strip().partition("@")
        kind, _, kernel = body.partition(":")
        ranks: tuple[int, ...] | None = None
        if ranks_text:
            try:
                ranks = tuple(int(r) for r in ranks_text.split("+"))
            except ValueError as exc:
                raise ValueError(f"bad ranks in {text!r}: {exc}") from exc
        kind = kind.strip()
        if kind not in {k.value for k in ShardingKind}:
            raise ValueError(
                f"unknown sharding type {kind!r} in {text!r}; expected one of "
                f"{[k.value for k in ShardingKind]}"
            )
        return cls(ShardingKind(kind), compute_kernel=kernel.strip() or None, ranks=ranks)

    def __str__(self) -> str:
        out = self.sharding_type.value
        if self.compute_kernel is not None:
            out += f":{self.compute_kernel}"
        if self.ranks is not None:
            out += "@" + "+".join(str(r) for r in self.ranks)
        return out


def _default_table_config() -> TableShardingConfig:
    return TableShardingConfig()


@dataclass(frozen=True)
class ShardingConfig:
    """Sharding of every table: a default plus per-table overrides.

    Args:
        default: config of tables not in ``per_table`` (a :class:`TableShardingConfig`, or a
            :class:`ShardingKind` / string, meaning that kind with the automatic kernel).
        per_table: overrides keyed by feature name (``"user_id"``) or table name
            (``"t_user_id"``); values as for ``default``.
        balance: who places table-wise tables without explicit ranks (:class:`Balance`);
            default ``bytes``.

    Example::

        cfg = ShardingConfig(per_table={"recent_items": TableShardingConfig("column_wise")})
        cfg = ShardingConfig.parse("table_wise,item_id=row_wise,device=data_parallel")
    """

    default: TableShardingConfig = field(default_factory=_default_table_config)
    per_table: Mapping[str, TableShardingConfig] = field(default_factory=dict)
    balance: Balance = Balance.BYTES

    def __post_init__(self) -> None:
        if self.balance not in _BALANCES:
            raise ValueError(
                f"unknown balance {self.balance!r}; expected one of {sorted(_BALANCES)}"
            )
        object.__setattr__(self, "balance", Balance(self.balance))
        object.__setattr__(self, "default", _as_table_config(self.default))
        object.__setattr__(
            self, "per_table", {str(k): _as_table_config(v) for k, v in self.per_table.items()}
        )

    def for_table(self, table: TableSpec) -> TableShardingConfig:
        """The config of ``table`` (its override by feature or table name, else the default)."""
        for key in (table.feature.value, table.name):
            if key in self.per_table:
                return self.per_table[key]
        return self.default

    def check(self, spec: FeatureSpec) -> None:
        """Raise ``ValueError`` if ``per_table`` names a table ``spec`` does not have."""
        known = {t.feature.value for t in spec.tables} | {t.name for t in spec.tables}
        unknown = sorted(set(self.per_table) - known)
        if unknown:
            raise ValueError(
                f"sharding config names unknown tables {unknown}; known: {sorted(known)}"
            )

    @classmethod
    def parse(cls, text: str) -> ShardingConfig:
        """Parse ``DEFAULT[,TABLE=CONFIG...][,balance=bytes|planner]``.

        Configs are as :meth:`TableShardingConfig.parse`; an entry without ``=`` sets the
        default; an empty string gives the default config.

        Args:
            text: e.g. ``"table_wise,recent_items=column_wise,item_id=row_wise:fused"``.

        Returns:
            The config.

        Raises:
            ValueError: on a malformed entry.

        Example::

            ShardingConfig.parse("data_parallel,user_id=table_wise@0")
        """
        default = TableShardingConfig()
        per_table: dict[str, TableShardingConfig] = {}
        balance = Balance.BYTES.value
        for raw in text.split(","):
            item = raw.strip()
            if not item:
                continue
            name, sep, value = item.partition("=")
            if sep and name.strip() == "balance":
                balance = value.strip()
            elif sep:
                per_table[name.strip()] = TableShardingConfig.parse(value)
            else:
                default = TableShardingConfig.parse(item)
        return cls(default=default, per_table=per_table, balance=Balance(balance))


_BALANCES = frozenset(b.value for b in Balance)


def _as_table_config(value: TableShardingConfig | ShardingKind | str) -> TableShardingConfig:
    if isinstance(value, TableShardingConfig):
        return value
    return TableShardingConfig.parse(str(value))


# --------------------------------------------------------------------------------- planning


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


def make_sharder(fused_params: dict[str, Any] | None = None) -> EmbeddingBagCollectionSharder:
    """The ``EmbeddingBagCollection`` sharder used for planning and sharding.

    Args:
        fused_params: extra FBGEMM kernel parameters (none are needed on CPU or CUDA for
            inference; the fused kernel's default optimizer is SGD, unused without backward).

    Returns:
        A fresh sharder.
    """
    return EmbeddingBagCollectionSharder(fused_params=fused_params)


def _sharders(fused_params: dict[str, Any] | None = None) -> list[ModuleSharder[nn.Module]]:
    return [cast(ModuleSharder[nn.Module], make_sharder(fused_params))]


def plan_sharding(
    spec: FeatureSpec,
    world_size: int,
    device_type: str = "cpu",
    config: ShardingConfig | None = None,
    batch_rows: int = 4096,
    local_world_size: int | None = None,
) -> ShardingPlan:
    """A ``ShardingPlan`` for the ranker's tables, without a process group.

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

    Args:
        spec: the feature spec (table sizes, embedding dim).
        world_size: number of ranks.
        device_type: ``"cpu"`` or ``"cuda"``.
        config: per-table sharding; default: every table table-wise, automatic kernel.
        batch_rows: rows per rank and batch, the planner's cost-model batch size.
        local_world_size: ranks per host (default ``world_size``: one host); sets the CUDA
            device index of each rank (``rank % local_world_size``) and table-row-wise groups.

    Returns:
        A plan with one entry, :data:`EBC_MODULE_PATH`, for a :class:`~model.ranker.Ranker`.

    Raises:
        ValueError: on a bad world size or device type, unknown tables in ``config``, ranks
            outside the world, a column split that does not divide the embedding dim, or a
            planner failure (its message is kept).

    Example::

        plan = plan_sharding(FeatureSpec(), 2)
        print(describe_plan(plan, FeatureSpec(), 2).render())
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
    cfg.check(spec)
    by_name = {t.name: t for t in spec.tables}
    table_cfg = {t.name: cfg.for_table(t) for t in spec.tables}
    for name, tc in table_cfg.items():
        if tc.ranks is not None and max(tc.ranks) >= world_size:
            raise ValueError(f"table {name}: ranks {tc.ranks} outside world_size {world_size}")
    offers = _PLANNER_OFFERS[device_type]
    planned = [
        n
        for n, tc in table_cfg.items()
        if tc.ranks is None
        and (tc.sharding_type, tc.kernel) in offers
        and not (cfg.balance is Balance.BYTES and tc.sharding_type is ShardingKind.TABLE_WISE)
    ]
    by_hand = [n for n in table_cfg if n not in planned]

    result = EmbeddingModuleShardingPlan()
    if planned:
        result.update(
            _run_planner(spec, planned, table_cfg, world_size, local_size, device_type, batch_rows)
        )
    load = [0] * world_size
    for ps in result.values():
        for rank, nbytes in _shard_bytes(ps):
            load[rank] += nbytes

    meta_ebc = EmbeddingBagCollection(
        tables=[c for c in embedding_bag_configs(spec) if c.name in by_hand], device="meta"
    )
    sharder = make_sharder()
    params = sharder.shardable_parameters(meta_ebc)
    # Biggest tables first, so the greedy balancer places them while ranks are still empty.
    for name in sorted(by_hand, key=lambda n: -by_name[n].num_embeddings):
        tc = table_cfg[name]
        gen = _hand_generator(tc, by_name[name], spec.embedding_dim, world_size, load)
        ps = gen(
            params[name],
            local_size,
            world_size,
            device_type,
            cast(ModuleSharder[nn.Module], sharder),
        )
        result[name] = ps
        for rank, nbytes in _shard_bytes(ps):
            load[rank] += nbytes

    ordered = EmbeddingModuleShardingPlan()
    for t in spec.tables:
        ordered[t.name] = result[t.name]
    return ShardingPlan({EBC_MODULE_PATH: ordered})


def _run_planner(
    spec: FeatureSpec,
    names: list[str],
    table_cfg: Mapping[str, TableShardingConfig],
    world_size: int,
    local_size: int,
    device_type: str,
    batch_rows: int,
) -> EmbeddingModuleShardingPlan:
    ebc = EmbeddingBagCollection(
        tables=[c for c in embedding_bag_configs(spec) if c.name in names], device="meta"
    )
    constraints = {
        n: ParameterConstraints(
            sharding_types=[ShardingType(table_cfg[n].sharding_type.value).value],
            compute_kernels=[table_cfg[n].kernel],
        )
        for n in names
    }
    with _quiet_planner():
        topology = Topology(
            world_size=world_size, compute_device=device_type, local_world_size=local_size
        )
        planner = EmbeddingShardingPlanner(
            topology=topology, batch_size=batch_rows, constraints=constraints, debug=False
        )
        try:
            plan = planner.plan(ebc, _sharders())
        except Exception as exc:  # PlannerError and friends: keep the planner's reason
            raise ValueError(f"sharding planner failed: {exc}") from exc
    module_plan = plan.plan.get("")
    if not isinstance(module_plan, EmbeddingModuleShardingPlan):
        raise ValueError(f"sharding planner returned no plan for the tables: {plan}")
    return module_plan


def _hand_generator(
    tc: TableShardingConfig,
    table: TableSpec,
    dim: int,
    world_size: int,
    load: list[int],
) -> ParameterShardingGenerator:
    kind, kernel = tc.sharding_type, tc.kernel

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


def _shard_bytes(ps: ParameterSharding) -> list[tuple[int, int]]:
    """(rank, fp32 bytes) of every shard of one table's ``ParameterSharding``."""
    if ps.sharding_spec is None:  # data parallel: a full copy on every rank
        return []
    out = []
    for shard in ps.sharding_spec.shards:
        placement = shard.placement
        rank = placement.rank() if placement is not None else 0
        numel = 1
        for size in shard.shard_sizes:
            numel *= int(size)
        out.append((int(rank), numel * _FP32_BYTES))
    return out


# ------------------------------------------------------------------------------- reporting


@dataclass(frozen=True)
class TablePlacement:
    """Where one table lives.

    Args:
        name: table name (``t_<feature>``).
        feature: the KJT key that looks it up.
        sharding_type: TorchRec sharding type value.
        compute_kernel: TorchRec compute kernel value.
        ranks: ranks holding a shard (or, for data-parallel, a copy).
        num_embeddings: rows.
        embedding_dim: columns.
        bytes_per_rank: fp32 bytes held per rank (ranks holding nothing are absent).
    """

    name: str
    feature: str
    sharding_type: str
    compute_kernel: str
    ranks: tuple[int, ...]
    num_embeddings: int
    embedding_dim: int
    bytes_per_rank: dict[int, int]

    @property
    def total_bytes(self) -> int:
        """Bytes summed over ranks (data-parallel counts every copy)."""
        return sum(self.bytes_per_rank.values())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "feature": self.feature,
            "sharding_type": self.sharding_type,
            "compute_kernel": self.compute_kernel,
            "ranks": list(self.ranks),
            "num_embeddings": self.num_embeddings,
            "embedding_dim": self.embedding_dim,
            "bytes_per_rank": {str(r): b for r, b in sorted(self.bytes_per_rank.items())},
        }


@dataclass(frozen=True)
class RankBytes:
    """fp32 embedding bytes held by one rank."""

    rank: int
    bytes: int


@dataclass(frozen=True)
class PlanReport:
    """What :func:`describe_plan` reports.

    Args:
        world_size: number of ranks.
        tables: one entry per table, in spec order.
        ranks: one entry per rank, ``0 .. world_size-1``.

    Example::

        report = describe_plan(plan, spec, 2)
        print(report.render())
        json.dumps(report.as_dict())
    """

    world_size: int
    tables: tuple[TablePlacement, ...]
    ranks: tuple[RankBytes, ...]

    @property
    def unsharded_bytes(self) -> int:
        """fp32 bytes of all tables held once (a single-process model)."""
        return sum(t.num_embeddings * t.embedding_dim * _FP32_BYTES for t in self.tables)

    @property
    def max_rank_bytes(self) -> int:
        """Bytes held by the most loaded rank."""
        return max((r.bytes for r in self.ranks), default=0)

    def as_dict(self) -> dict[str, Any]:
        """``{"world_size": N, "tables": [...], "ranks": [{"rank": r, "bytes": b}, ...]}``."""
        return {
            "world_size": self.world_size,
            "tables": [t.as_dict() for t in self.tables],
            "ranks": [{"rank": r.rank, "bytes": r.bytes} for r in self.ranks],
        }

    def render(self) -> str:
        """A plain-text table: one line per table, then one per rank."""
        head = ("table", "sharding", "kernel", "rows x dim", "ranks", "bytes per rank")
        rows = [head]
        for t in self.tables:
            per_rank = ", ".join(
                f"{r}:{_human_bytes(b)}" for r, b in sorted(t.bytes_per_rank.items())
            )
            rows.append(
                (
                    t.name,
                    t.sharding_type,
                    t.compute_kernel,
                    f"{t.num_embeddings} x {t.embedding_dim}",
                    ",".join(str(r) for r in t.ranks),
                    per_rank,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [f"sharding plan for {self.world_size} rank(s)"]
        for i, row in enumerate(rows):
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        total = self.unsharded_bytes
        lines.append("")
        for r in self.ranks:
            share = r.bytes / total if total else 0.0
            lines.append(
                f"rank {r.rank}: {_human_bytes(r.bytes)} ({r.bytes} bytes, "
                f"{share:.1%} of {_human_bytes(total)} unsharded)"
            )
        return "\n".join(lines)


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable


def describe_plan(plan: ShardingPlan, spec: FeatureSpec, world_size: int) -> PlanReport:
    """Per-table placement and per-rank fp32 embedding bytes of ``plan``.

    Bytes come from the shard metadata (``ParameterSharding.sharding_spec`` shard sizes, 4 bytes
    per element); a data-parallel table counts in full on every rank.

    Args:
        plan: e.g. from :func:`plan_sharding`.
        spec: the spec the plan was made for.
        world_size: number of ranks.

    Returns:
        The :class:`PlanReport`.

    Raises:
        ValueError: if ``plan`` lacks the ranker's tables.

    Example::

        report = describe_plan(plan_sharding(spec, 2), spec, 2)
        assert report.max_rank_bytes <= report.unsharded_bytes
    """
    module_plan = plan.plan.get(EBC_MODULE_PATH)
    if not isinstance(module_plan, EmbeddingModuleShardingPlan):
        raise ValueError(f"plan has no entry for {EBC_MODULE_PATH}")
    rank_totals = [0] * world_size
    tables = []
    for t in spec.tables:
        if t.name not in module_plan:
            raise ValueError(f"plan has no entry for table {t.name}")
        ps = module_plan[t.name]
        full = t.num_embeddings * spec.embedding_dim * _FP32_BYTES
        per_rank: dict[int, int] = {}
        if ps.sharding_spec is None:
            ranks = tuple(range(world_size))
            per_rank = dict.fromkeys(ranks, full)
        else:
            for rank, nbytes in _shard_bytes(ps):
                per_rank[rank] = per_rank.get(rank, 0) + nbytes
            ranks = tuple(sorted(per_rank))
        for rank, nbytes in per_rank.items():
            if not 0 <= rank < world_size:
                raise ValueError(f"table {t.name} has a shard on rank {rank} >= {world_size}")
            rank_totals[rank] += nbytes
        tables.append(
            TablePlacement(
                name=t.name,
                feature=t.feature.value,
                sharding_type=str(ps.sharding_type),
                compute_kernel=str(ps.compute_kernel),
                ranks=ranks,
                num_embeddings=t.num_embeddings,
                embedding_dim=spec.embedding_dim,
                bytes_per_rank=per_rank,
            )
        )
    return PlanReport(
        world_size=world_size,
        tables=tuple(tables),
        ranks=tuple(RankBytes(r, b) for r, b in enumerate(rank_totals)),
    )


# -------------------------------------------------------------------------------- sharding


def default_backend() -> str:
    """``"nccl"`` when CUDA is available, else ``"gloo"``."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def rank_device(local_rank: int) -> torch.device:
    """``cuda:<local_rank>`` when CUDA is available (and made current), else ``cpu``.

    Args:
        local_rank: the process's rank on its host (``LOCAL_RANK`` under torchrun).

    Returns:
        The device to put this rank's model and batches on.
    """
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def init_distributed(
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    backend: str | None = None,
    timeout_s: float = 300.0,
) -> torch.device:
    """Initialise the default process group (if not yet) and pick this rank's device.

    Missing arguments come from the environment torchrun sets (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``; ``MASTER_ADDR``/``MASTER_PORT`` are read by ``env://``).

    Args:
        rank: global rank.
        world_size: number of ranks.
        local_rank: rank on this host (defaults to ``rank``).
        backend: default :func:`default_backend` (NCCL with CUDA, else gloo).
        timeout_s: collective timeout.

    Returns:
        :func:`rank_device` of the local rank.

    Example::

        device = init_distributed()  # under torchrun
        dmp = shard_ranker(spec, plan_sharding(spec, dist.get_world_size(), device.type), device)
    """
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    device = rank_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend or default_backend(),
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    return device


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
    :func:`model.distributed_checkpoint.load_sharded`). With a ranker whose tables are
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
        probs = sharded_scores(dmp, inp.to(device))
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
    env = ShardingEnv.from_process_group(pg) if pg is not None else None
    dmp = DistributedModelParallel(
        module=ranker,
        env=env,
        device=dev,
        plan=plan,
        sharders=_sharders(fused_params),
        init_data_parallel=init_data_parallel,
    )
    if state is not None:
        load_unsharded_state_dict(dmp, state)
    dmp.eval()
    nbytes = local_embedding_bytes(dmp)
    _log.info(
        "sharded ranker: rank %d holds %d embedding bytes (%.1f MiB)",
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
        state_dict: e.g. :func:`model.checkpoint.load_state_dict`'s result (any device).
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


def sharded_scores(dmp: nn.Module, inp: ModelInput) -> torch.Tensor:
    """Click probabilities of this rank's local batch (collective: all ranks call together).

    Runs under ``torch.no_grad()`` (the fused CPU kernel fails under ``inference_mode``).

    Args:
        dmp: the sharded model (or a plain :class:`~model.ranker.Ranker`).
        inp: this rank's batch, on the rank's device (any row count, zero included).

    Returns:
        float32[R] probabilities.

    Example::

        probs = sharded_scores(dmp, pad_model_input(inp, 1024).to(device))[: inp.num_rows]
    """
    with torch.no_grad():
        logits: torch.Tensor = dmp(inp.dense, inp.sparse)
        return torch.sigmoid(logits.reshape(-1))


def local_embedding_bytes(dmp: nn.Module) -> int:
    """Bytes of embedding-table data held by this rank.

    Counts the local shards of every sharded table plus full copies of data-parallel tables,
    from the model's state dict (so a plain :class:`~model.ranker.Ranker` reports its whole
    tables). Tensors on the meta device count zero.

    Args:
        dmp: the sharded model (or any module containing the ranker's tables).

    Returns:
        Bytes (fp32 tables: ``4 * rows * dim`` per shard).

    Example::

        log.info("rank %d holds %.1f MiB of tables", rank, local_embedding_bytes(dmp) / 2**20)
    """
    total = 0
    for key, value in dmp.state_dict().items():
        if ".embedding_bags." not in key:
            continue
        total += _local_tensor_bytes(value)
    return total


def _local_tensor_bytes(value: object) -> int:
    local_shards = getattr(value, "local_shards", None)
    if callable(local_shards):  # ShardedTensor
        return sum(_plain_bytes(s.tensor) for s in local_shards())
    to_local = getattr(value, "to_local", None)
    if callable(to_local):  # DTensor
        return _plain_bytes(cast(torch.Tensor, to_local()))
    if isinstance(value, torch.Tensor):
        return _plain_bytes(value)
    return 0


def _plain_bytes(t: torch.Tensor) -> int:
    return 0 if t.is_meta else t.numel() * t.element_size()
