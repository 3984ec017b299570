"""``streamrank bench ranks``: end-to-end rows/s with 1, 2, 4... ranks, embedding bytes per rank,
and each rank's step time with the share of it spent in the step agreement's collective (from
the ranks' ``streamrank_rank_step_duration_seconds`` / ``streamrank_collective_duration_seconds``
histograms, which each rank writes into its run summary as ``rank_steps``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from model.synthetic import SyntheticWorld
from pipeline.settings.loading import Settings
from pipeline.tools.bench.common import BenchTopics, score_backlog, seeded_world
from pipeline.tools.synthetic_io import produce_events


def _run_ranks_once(
    settings: Settings, world: SyntheticWorld, events: int, nproc: int, bench_topics: BenchTopics
) -> dict[str, Any]:
    """Produce ``events`` to fresh topics, then ``streamrank run --nproc N`` until idle.

    Reads the job's summary (``--summary-json``: merged over the ranks, each rank's figures
    under ``ranks``; a 1-rank run is one process and has no ``ranks``).
    """
    topics, tag = bench_topics.fresh(max(settings.topics.partitions, nproc))
    run_settings = settings.model_copy(update={"topics": topics})
    produce_events(run_settings, world, events)
    parts = score_backlog(topics, f"bench-{tag}", nproc)
    rows = sum(p["rows_scored"] for p in parts)
    out = sum(p["events_out"] for p in parts)
    if out < events:
        raise RuntimeError(f"{nproc}-rank run scored {out} of {events} events")
    busy = max(p["busy_seconds"] for p in parts)
    return {
        "rows_per_s": rows / busy if busy else 0.0,
        "rank_rows": [p["rows_scored"] for p in parts],
        "rank_steps": [p.get("rank_steps", {}) for p in parts],
    }


def _bytes_per_rank(settings: Settings, nprocs: tuple[int, ...]) -> dict[int, Any]:
    """Per world size, the planned embedding bytes of each rank (CPU plan)."""
    from model.distributed import describe_plan, plan_sharding
    from model.store.checkpoint import load_spec

    spec = load_spec(settings.model.checkpoint)
    memory = {}
    for n in nprocs:
        plan = plan_sharding(
            spec,
            n,
            "cpu",
            settings.model.sharding.config,
            max_batch_rows=settings.batching.max_batch_rows,
        )
        memory[n] = describe_plan(plan, spec, n).as_dict()["ranks"]
    return memory


def bench_ranks(
    settings: Settings,
    events: int,
    rounds: int,
    nprocs: tuple[int, ...] = (1, 2),
    report: Callable[[str], None] = print,
    keep_topics: bool = False,
) -> dict[str, Any]:
    """End-to-end rows/s with 1 vs N ranks (interleaved rounds) and per-rank embedding bytes.

    Args:
        settings: the stack and the model (``model.checkpoint`` must hold a checkpoint).
        events: events per run.
        rounds: interleaved rounds over ``nprocs``.
        nprocs: world sizes to compare; the first is the base of the ratios (a 1-rank run
            is a single process: no rank step times).
        report: called with one line of progress per run.
        keep_topics: keep the runs' topics (default: deleted at the end).

    Returns:
        Rows/s per world size and round, ratios over the first, bytes (and lookup work) per
        rank, and per round the ranks' step stats
        (:func:`pipeline.jobs.summaries.step_stats`).

    Example::

        bench_ranks(settings, 5000, 2)["ratio_over_1_rank"]["2"]
    """
    world = seeded_world(settings)
    memory = _bytes_per_rank(settings, nprocs)
    rates: dict[int, list[float]] = {n: [] for n in nprocs}
    steps: dict[int, list[list[dict[str, float]]]] = {n: [] for n in nprocs}
    with BenchTopics(settings, keep_topics) as topics:
        for r in range(rounds):
            for n in nprocs:
                result = _run_ranks_once(settings, world, events, n, topics)
                rates[n].append(result["rows_per_s"])
                steps[n].append(result["rank_steps"])
                shares = [s.get("collective_share") for s in result["rank_steps"]]
                means = [s.get("step_mean_ms") for s in result["rank_steps"]]
                report(
                    f"round {r + 1}: {n} rank(s) {result['rows_per_s']:,.0f} rows/s "
                    f"(rows per rank {result['rank_rows']}; step ms per rank {means}, "
                    f"collective share {shares})"
                )
    base = nprocs[0]
    return {
        "events": events,
        "batch_rows": settings.batching.max_batch_rows,
        "rows_per_s": {str(n): [round(v, 1) for v in rates[n]] for n in nprocs},
        "ratio_over_1_rank": {
            str(n): [round(a / b, 3) for a, b in zip(rates[n], rates[base], strict=True)]
            for n in nprocs
        },
        "embedding_bytes_per_rank": {str(n): memory[n] for n in nprocs},
        "rank_steps": {str(n): steps[n] for n in nprocs},
    }
