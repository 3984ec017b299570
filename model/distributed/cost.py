"""What one shard of a table costs its rank: bytes held and lookup work per scored row.

Work measure: **bytes read per scored row**. A table looked up ``p`` times per row
(:func:`lookups_per_row`: 1 for user, item, category, device and country; up to
``recent_items_cap`` for ``recent_items``, counted at the cap) reads ``p x dim x 4`` bytes per
row from its embeddings. A shard of ``rows x cols`` of a table of ``n`` rows does its share of
those lookups on its columns: ``p x cols x 4 x rows / n`` (uniformly hashed ids spread lookups
evenly over rows). So every column shard of a table does all of that table's lookups on its
own columns, a row shard does ``rows / n`` of them on all columns, and a data-parallel copy
does the lookups of its own rank's rows (``1 / world_size`` of the batch). A batch of ``B``
rows costs a rank ``B x`` its per-row work.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchrec.distributed.types import ParameterSharding

from model.features.spec import FeatureSpec, SparseFeature, TableSpec

__all__ = ["FP32_BYTES", "ShardLoad", "lookups_per_row", "shard_loads", "table_load"]

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


def lookups_per_row(spec: FeatureSpec, table: TableSpec) -> int:
    """Embedding lookups one scored row makes in ``table`` (the pooling factor, at its cap).

    Args:
        spec: the feature spec (``recent_items_cap``).
        table: one of its tables.

    Returns:
        ``spec.recent_items_cap`` for ``recent_items``, else 1.

    Example::

        lookups_per_row(FeatureSpec(), FeatureSpec().tables[-1])  # 20
    """
    return spec.recent_items_cap if table.feature is SparseFeature.RECENT_ITEMS else 1


def table_load(spec: FeatureSpec, table: TableSpec) -> tuple[int, float]:
    """(fp32 bytes, work per scored row) of the whole of ``table`` held on one rank.

    Args:
        spec: the feature spec.
        table: one of its tables.

    Returns:
        ``(num_embeddings x dim x 4, lookups x dim x 4)``.
    """
    dim = spec.embedding_dim
    return table.num_embeddings * dim * FP32_BYTES, float(
        lookups_per_row(spec, table) * dim * FP32_BYTES
    )


def shard_loads(
    ps: ParameterSharding, spec: FeatureSpec, table: TableSpec, world_size: int
) -> list[ShardLoad]:
    """The :class:`ShardLoad` of every shard of one table's plan entry.

    Args:
        ps: the table's ``ParameterSharding``.
        spec: the feature spec.
        table: the table.
        world_size: number of ranks (a data-parallel table has a copy on each).

    Returns:
        One entry per shard (data-parallel: one per rank, full bytes, ``1/world_size`` of the
        table's work).

    Example::

        loads = shard_loads(plan.plan[EBC_MODULE_PATH]["t_user_id"], spec, spec.tables[0], 2)
    """
    full_bytes, full_work = table_load(spec, table)
    if ps.sharding_spec is None:  # data parallel: each rank looks up its own rows
        return [ShardLoad(r, full_bytes, full_work / world_size) for r in range(world_size)]
    out = []
    per_cell = lookups_per_row(spec, table) * FP32_BYTES / table.num_embeddings
    for shard in ps.sharding_spec.shards:
        placement = shard.placement
        rank = placement.rank() if placement is not None else 0
        rows, cols = (int(s) for s in shard.shard_sizes)
        out.append(ShardLoad(int(rank), rows * cols * FP32_BYTES, per_cell * rows * cols))
    return out
