"""Sharding configuration: how each embedding table is split across ranks.

Plain dataclasses and string enums, free of torch and TorchRec imports, so configuration
loading (``pipeline.settings.loading``) can build and validate them without importing
``torchrec.distributed``. :func:`model.distributed.planner.plan_sharding` turns a
:class:`ShardingConfig` into a TorchRec ``ShardingPlan``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from model.features.spec import FeatureSpec

__all__ = [
    "SEQUENCE_SHARDING",
    "Balance",
    "ComputeKernel",
    "ShardingConfig",
    "ShardingKind",
    "TableShardingConfig",
]


class ComputeKernel(enum.StrEnum):
    """Embedding compute kernels offered here (values are TorchRec's ``EmbeddingComputeKernel``)."""

    #: FBGEMM table-batched kernel (the only one the planner offers for sharded tables on CPU).
    FUSED = "fused"
    #: Plain ``nn.EmbeddingBag`` lookups (data-parallel tables).
    DENSE = "dense"


class Balance(enum.StrEnum):
    """Who places table-wise tables that have no explicit ranks."""

    #: Balance bytes *and* lookup work per rank, splitting tables larger than their fair share
    #: over every rank (column-wise, or row-wise where the columns do not split evenly):
    #: :mod:`model.distributed.balance`. The default.
    SPLIT = "split"
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


SEQUENCE_SHARDING = frozenset(
    {ShardingKind.TABLE_WISE, ShardingKind.COLUMN_WISE, ShardingKind.ROW_WISE}
)
"""How a sequence table (``EmbeddingCollection``) may be sharded here: its sharder offers
data-parallel too, but TorchRec 1.8's data-parallel ``EmbeddingCollection`` fails on a KJT
that holds other keys (``construct_jagged_tensors``: split sizes), and it offers no
table-row-wise or table-column-wise."""


@dataclass(frozen=True)
class TableShardingConfig:
    """Sharding of one table.

    Args:
        sharding_type: a :class:`ShardingKind` (or its string value).
        compute_kernel: a :class:`ComputeKernel` (or its value), or ``None`` for automatic:
            ``dense`` for data-parallel, else ``fused``.
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
    compute_kernel: ComputeKernel | None = None
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
        object.__setattr__(self, "compute_kernel", _as_kernel(self.compute_kernel))
        if kind is ShardingKind.DATA_PARALLEL and self.compute_kernel is ComputeKernel.FUSED:
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
    def kernel(self) -> ComputeKernel:
        """The resolved compute kernel (``compute_kernel`` or the automatic choice)."""
        if self.compute_kernel is not None:
            return self.compute_kernel
        if self.sharding_type is ShardingKind.DATA_PARALLEL:
            return ComputeKernel.DENSE
        return ComputeKernel.FUSED

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
        return cls(
            ShardingKind(kind), compute_kernel=_as_kernel(kernel.strip() or None), ranks=ranks
        )

    def __str__(self) -> str:
        out = self.sharding_type.value
        if self.compute_kernel is not None:
            out += f":{self.compute_kernel.value}"
        if self.ranks is not None:
            out += "@" + "+".join(str(r) for r in self.ranks)
        return out


class NamedTable(Protocol):
    """A table as the sharding config names it: by table name or by a feature's name."""

    @property
    def name(self) -> str: ...

    @property
    def feature_names(self) -> tuple[str, ...]: ...


def _as_kernel(value: ComputeKernel | str | None) -> ComputeKernel | None:
    if value is None:
        return None
    try:
        return ComputeKernel(value)
    except ValueError as exc:
        raise ValueError(
            f"unknown compute kernel {value!r}; expected one of "
            f"{[k.value for k in ComputeKernel]} or None"
        ) from exc


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
            default ``split``.

    Example::

        cfg = ShardingConfig(per_table={"recent_items": TableShardingConfig("column_wise")})
        cfg = ShardingConfig.parse("table_wise,item_id=row_wise,device=data_parallel")
    """

    default: TableShardingConfig = field(default_factory=_default_table_config)
    per_table: Mapping[str, TableShardingConfig] = field(default_factory=dict)
    balance: Balance = Balance.SPLIT

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

    def for_table(self, table: NamedTable) -> TableShardingConfig:
        """The config of ``table`` (its override by feature or table name, else the default)."""
        for key in (*table.feature_names, table.name):
            if key in self.per_table:
                return self.per_table[key]
        return self.default

    def check(self, tables: FeatureSpec | Sequence[NamedTable]) -> None:
        """Raise ``ValueError`` if ``per_table`` names a table the model does not have.

        Args:
            tables: the built-in spec, or any model's tables.
        """
        listed: Sequence[NamedTable] = tables.tables if isinstance(tables, FeatureSpec) else tables
        known = {f for t in listed for f in t.feature_names} | {t.name for t in listed}
        unknown = sorted(set(self.per_table) - known)
        if unknown:
            raise ValueError(
                f"sharding config names unknown tables {unknown}; known: {sorted(known)}"
            )

    @classmethod
    def parse(cls, text: str) -> ShardingConfig:
        """Parse ``DEFAULT[,TABLE=CONFIG...][,balance=split|bytes|planner]``.

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
        balance = Balance.SPLIT.value
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
