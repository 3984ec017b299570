"""Reporting a plan: which rank holds which part of which table, its bytes and lookup work.

Work is bytes read from embeddings per scored row (:mod:`model.distributed.cost`); a batch of
``B`` rows costs a rank ``B x`` that. The balance of a plan is the busiest rank's bytes (work)
over the ideal, the mean over ranks.

:func:`describe_plan` reads a ``ShardingPlan``'s shard metadata (no process group) into a
:class:`PlanReport`, which renders as text (``streamrank plan``) or a JSON-ready dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingPlan

from model.distributed.cost import FP32_BYTES, Tables, as_tables, shard_loads

__all__ = ["PlanReport", "RankBytes", "TablePlacement", "describe_plan"]


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
        work_per_rank: bytes read per scored row, per rank (as ``bytes_per_rank``).
    """

    name: str
    feature: str
    sharding_type: str
    compute_kernel: str
    ranks: tuple[int, ...]
    num_embeddings: int
    embedding_dim: int
    bytes_per_rank: dict[int, int]
    work_per_rank: dict[int, float]

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
            "work_per_rank": {str(r): w for r, w in sorted(self.work_per_rank.items())},
        }


@dataclass(frozen=True)
class RankBytes:
    """What one rank holds: fp32 embedding bytes, and bytes read per scored row (work)."""

    rank: int
    bytes: int
    work: float = 0.0


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
        return sum(t.num_embeddings * t.embedding_dim * FP32_BYTES for t in self.tables)

    @property
    def max_rank_bytes(self) -> int:
        """Bytes held by the most loaded rank."""
        return max((r.bytes for r in self.ranks), default=0)

    @property
    def bytes_ratio(self) -> float:
        """The busiest rank's bytes over the ideal (all ranks' bytes / ranks); 1.0 is even."""
        total = sum(r.bytes for r in self.ranks)
        return self.max_rank_bytes * len(self.ranks) / total if total else 1.0

    @property
    def work_ratio(self) -> float:
        """The busiest rank's work over the ideal (all ranks' work / ranks); 1.0 is even."""
        total = sum(r.work for r in self.ranks)
        busiest = max((r.work for r in self.ranks), default=0.0)
        return busiest * len(self.ranks) / total if total else 1.0

    def as_dict(self) -> dict[str, Any]:
        """``{"world_size": N, "tables": [...], "ranks": [{"rank", "bytes", "work"}, ...],
        "balance": {"bytes_ratio", "work_ratio", ...}}`` (work: bytes read per scored row)."""
        total_bytes = sum(r.bytes for r in self.ranks)
        total_work = sum(r.work for r in self.ranks)
        n = max(len(self.ranks), 1)
        return {
            "world_size": self.world_size,
            "tables": [t.as_dict() for t in self.tables],
            "ranks": [{"rank": r.rank, "bytes": r.bytes, "work": r.work} for r in self.ranks],
            "work_unit": "bytes read from embeddings per scored row",
            "balance": {
                "ideal_bytes": total_bytes / n,
                "max_bytes": self.max_rank_bytes,
                "bytes_ratio": round(self.bytes_ratio, 4),
                "ideal_work": total_work / n,
                "max_work": max((r.work for r in self.ranks), default=0.0),
                "work_ratio": round(self.work_ratio, 4),
            },
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
                f"{share:.1%} of {_human_bytes(total)} unsharded), "
                f"reads {r.work:.0f} B per scored row"
            )
        lines.append(
            f"busiest rank / ideal: bytes {self.bytes_ratio:.3f}, work {self.work_ratio:.3f}"
        )
        return "\n".join(lines)


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable


def describe_plan(plan: ShardingPlan, model_tables: Tables, world_size: int) -> PlanReport:
    """Per-table placement and per-rank fp32 embedding bytes of ``plan``.

    Bytes come from the shard metadata (``ParameterSharding.sharding_spec`` shard sizes, 4 bytes
    per element); a data-parallel table counts in full on every rank.

    Args:
        plan: e.g. from :func:`plan_sharding`.
        model_tables: the tables the plan was made for (a spec, or any module's).
        world_size: number of ranks.

    Returns:
        The :class:`PlanReport`.

    Raises:
        ValueError: if ``plan`` lacks one of the tables.

    Example::

        report = describe_plan(plan_sharding(spec, 2), spec, 2)
        assert report.max_rank_bytes <= report.unsharded_bytes
    """
    rank_totals = [0] * world_size
    rank_work = [0.0] * world_size
    tables = []
    for t in as_tables(model_tables):
        module_plan = plan.plan.get(t.module_path)
        if not isinstance(module_plan, EmbeddingModuleShardingPlan) or t.name not in module_plan:
            raise ValueError(f"plan has no entry for table {t.name} (at {t.module_path!r})")
        ps = module_plan[t.name]
        per_rank: dict[int, int] = {}
        work: dict[int, float] = {}
        for shard in shard_loads(ps, t, world_size):
            if not 0 <= shard.rank < world_size:
                raise ValueError(f"table {t.name} has a shard on rank {shard.rank} >= {world_size}")
            per_rank[shard.rank] = per_rank.get(shard.rank, 0) + shard.bytes
            work[shard.rank] = work.get(shard.rank, 0.0) + shard.work
            rank_totals[shard.rank] += shard.bytes
            rank_work[shard.rank] += shard.work
        ranks = tuple(sorted(per_rank))
        tables.append(
            TablePlacement(
                name=t.name,
                feature=",".join(t.feature_names),
                sharding_type=str(ps.sharding_type),
                compute_kernel=str(ps.compute_kernel),
                ranks=ranks,
                num_embeddings=t.num_embeddings,
                embedding_dim=t.embedding_dim,
                bytes_per_rank=per_rank,
                work_per_rank=work,
            )
        )
    return PlanReport(
        world_size=world_size,
        tables=tuple(tables),
        ranks=tuple(
            RankBytes(r, b, w) for r, (b, w) in enumerate(zip(rank_totals, rank_work, strict=True))
        ),
    )
