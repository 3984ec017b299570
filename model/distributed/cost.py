"""What one shard of a table costs its rank: bytes held and lookup work per scored row.

Work measure: **bytes read per scored row**. A table looked up ``p`` times per row
(:attr:`~model.module.types.TableConfig.ids_per_row`: 1 for a single-valued feature, e.g. the
built-in model's user, item, category, device and country; up to ``recent_items_cap`` for
``recent_items``, counted at the cap) reads ``p x dim x 4`` bytes per
row from its embeddings. A shard of ``rows x cols`` of a table of ``n`` rows does its share of
those lookups on its columns: ``p x cols x 4 x rows / n`` (uniformly hashed ids spread lookups
evenly over rows). So every column shard of a table does all of that table's lookups on its
own columns, a row shard does ``rows / n`` of them on all columns, and a data-parallel copy
does the lookups of its own rank's rows (``1 / world_size`` of the batch). A batch of ``B``
rows costs a rank ``B x`` its per-row work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torchrec.distributed.types import ParameterSharding

from model.features.spec import FeatureSpec
from model.module.types import TableConfig

__all__ = ["FP32_BYTES", "ShardLoad", "Tables", "as_tables", "shard_loads", "table_load"]

Tables = FeatureSpec | Sequence[TableConfig]
"""A model's tables: the built-in spec's, or any module's (:mod:`model.module.checks`)."""

#: Bytes per element of an fp32 table.
FP32_BYTES = 4


@dataclass(frozen=True)
class ShardLoad:
    """Cost of one shard (or data-parallel copy) of a table on one rank.

    Args:
        rank: the rank holding it.
        bytes: fp32 bytes held.
        work: bytes read per scored row (module docstring).
    """

    rank: int
    bytes: int
    work: float


def as_tables(tables: Tables) -> tuple[TableConfig, ...]:
    """The tables of a spec (:meth:`FeatureSpec.table_configs`), or ``tables`` as a tuple."""
    return tables.table_configs() if isinstance(tables, FeatureSpec) else tuple(tables)


def table_load(table: TableConfig) -> tuple[int, float]:
    """(fp32 bytes, work per scored row) of the whole of ``table`` held on one rank.

    Args:
        table: one table.

    Returns:
        ``(num_embeddings x dim x 4, ids_per_row x dim x 4)``.
    """
    dim = table.embedding_dim
    return table.num_embeddings * dim * FP32_BYTES, float(table.ids_per_row * dim * FP32_BYTES)


def shard_loads(ps: ParameterSharding, table: TableConfig, world_size: int) -> list[ShardLoad]:
    """The :class:`ShardLoad` of every shard of one table's plan entry.

    Args:
        ps: the table's ``ParameterSharding``.
        table: the table.
        world_size: number of ranks (a data-parallel table has a copy on each).

    Returns:
        One entry per shard (data-parallel: one per rank, full bytes, ``1/world_size`` of the
        table's work).

    Example::

        loads = shard_loads(plan.plan[EBC_MODULE_PATH]["t_user_id"], tables[0], 2)
    """
    full_bytes, full_work = table_load(table)
    if ps.sharding_spec is None:  # data parallel: each rank looks up its own rows
        return [ShardLoad(r, full_bytes, full_work / world_size) for r in range(world_size)]
    out = []
    per_cell = table.ids_per_row * FP32_BYTES / table.num_embeddings
    for shard in ps.sharding_spec.shards:
        placement = shard.placement
        rank = placement.rank() if placement is not None else 0
        rows, cols = (int(s) for s in shard.shard_sizes)
        out.append(ShardLoad(int(rank), rows * cols * FP32_BYTES, per_cell * rows * cols))
    return out
