"""Placing tables by bytes *and* lookup work, splitting the big ones over every rank.

:func:`split_placement` is the ``balance = "split"`` placement of table-wise tables without
explicit ranks (:func:`model.distributed.planner.plan_sharding`). Every table starts whole and
whole tables are packed largest first, each onto the rank where the rank's larger normalised
load (bytes / ideal bytes, work / ideal work, :mod:`model.distributed.cost`) grows least. While
the busiest rank is above ``target`` x the ideal, the largest table still whole is split evenly
over all ranks, and the rest is packed again. The best packing seen is kept: small tables stay
whole (one rank, no extra all-to-all), big ones are split only as far as the balance needs.

A split table is column-wise (each rank ``dim / world_size`` columns, all of the table's
lookups on them) when that width is a multiple of :data:`COLUMN_UNIT`, else row-wise (each
rank about ``rows / world_size`` rows and that share of the lookups, on all columns; on CPU
only through a hand-built plan, which :mod:`model.distributed.planner` builds). Either way each
rank gets ``1 / world_size`` of the table's bytes and work: column shards of uneven width
(``64 = 24 + 20 + 20``) would balance 3, 5, 6 or 7 ranks only to within a column unit, 1/16
of a dim-64 table, too coarse when one table is most of the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from model.distributed.config import ShardingKind
from model.distributed.cost import table_load
from model.module.types import TableConfig

__all__ = ["COLUMN_UNIT", "Placement", "split_kind", "split_placement"]

#: Column shards are multiples of this many columns (FBGEMM's fused kernel wants dims % 4 == 0).
COLUMN_UNIT = 4


@dataclass(frozen=True)
class Placement:
    """Where the placed tables go, and the balance reached.

    Args:
        whole: table name -> the one rank holding all of it (table-wise).
        split: names of the tables split over every rank (:func:`split_kind`).
        max_ratio: the busiest rank's larger load over its ideal (bytes or work), base loads
            included.
    """

    whole: Mapping[str, int]
    split: frozenset[str]
    max_ratio: float


def split_kind(embedding_dim: int, world_size: int) -> ShardingKind:
    """How a split table is spread over ``world_size`` ranks (module docstring).

    Args:
        embedding_dim: the tables' width.
        world_size: number of ranks.

    Returns:
        ``COLUMN_WISE`` if ``embedding_dim / world_size`` is a whole multiple of
        :data:`COLUMN_UNIT`, else ``ROW_WISE``.

    Example::

        split_kind(64, 4)  # COLUMN_WISE (16 columns each); split_kind(64, 3): ROW_WISE
    """
    if embedding_dim % (world_size * COLUMN_UNIT) == 0:
        return ShardingKind.COLUMN_WISE
    return ShardingKind.ROW_WISE


def split_placement(
    tables: Sequence[TableConfig],
    world_size: int,
    base_bytes: Sequence[float] | None = None,
    base_work: Sequence[float] | None = None,
    target: float = 1.1,
) -> Placement:
    """Place ``tables`` on ``world_size`` ranks, balancing bytes and lookup work.

    Args:
        tables: the tables to place (dims, ids per row).
        world_size: number of ranks.
        base_bytes: bytes per rank already placed (other tables); default zeros.
        base_work: work per rank already placed; default zeros.
        target: stop splitting once the busiest rank is within this factor of the ideal.

    Returns:
        The :class:`Placement`.

    Example::

        placed = split_placement(spec.table_configs(), 4)
        placed.split  # frozenset({"t_user_id", "t_recent_items"})
    """
    base_b = list(base_bytes) if base_bytes is not None else [0.0] * world_size
    base_w = list(base_work) if base_work is not None else [0.0] * world_size
    loads = {t.name: table_load(t) for t in tables}
    ideal_b = max((sum(base_b) + sum(b for b, _ in loads.values())) / world_size, 1.0)
    ideal_w = max((sum(base_w) + sum(w for _, w in loads.values())) / world_size, 1.0)

    def size(name: str) -> tuple[float, str]:
        return -max(loads[name][0] / ideal_b, loads[name][1] / ideal_w), name

    order = sorted(loads, key=size)  # biggest first: the order in which tables get split
    best: Placement | None = None
    for count in range(len(order) + 1 if world_size > 1 else 1):
        split = frozenset(order[:count])
        held_b, held_w = list(base_b), list(base_w)
        for name in split:
            held_b = [b + loads[name][0] / world_size for b in held_b]
            held_w = [w + loads[name][1] / world_size for w in held_w]
        whole: dict[str, int] = {}
        for name in order[count:]:
            b, w = loads[name]
            rank = min(
                range(world_size),
                key=lambda r: (max((held_b[r] + b) / ideal_b, (held_w[r] + w) / ideal_w), r),
            )
            held_b[rank] += b
            held_w[rank] += w
            whole[name] = rank
        ratio = max(max(b / ideal_b, w / ideal_w) for b, w in zip(held_b, held_w, strict=True))
        if best is None or ratio < best.max_ratio - 1e-12:
            best = Placement(whole=whole, split=split, max_ratio=ratio)
        if ratio <= target:
            break
    assert best is not None  # the loop runs at least once
    return best
