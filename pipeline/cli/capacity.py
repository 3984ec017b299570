"""``streamrank plan-capacity``: a capacity plan (host cores, GPUs, ranks, ingest workers,
partitions) for a target event rate, from the benchmarks' ``--json`` reports
(:mod:`pipeline.tools.capacity`; docs/capacity.md). Runs nothing, needs no stack."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.common import ConfigOption, JsonOption, emit
from pipeline.cli.errors import UserError


def plan_capacity(
    reports: Annotated[
        list[Path],
        typer.Option(
            "--from",
            help="A benchmark's --json report (bench overhead, model, latency, ingest); "
            "repeat for each.",
        ),
    ],
    events_per_s: Annotated[float, typer.Option(help="Peak events per second.")] = 120_000.0,
    candidates: Annotated[float, typer.Option(help="Mean candidates per event.")] = 60.0,
    p99_ms: Annotated[float, typer.Option(help="End-to-end p99 to hold (ms).")] = 100.0,
    utilisation: Annotated[
        float,
        typer.Option(
            help="Fraction of measured capacity to plan for when no bench latency report says "
            "at which load p99 held."
        ),
    ] = 0.5,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Print the plan for --events-per-s at --candidates per event and p99 under --p99-ms: each
    input with the report it came from, each result with its arithmetic; "not measured" where
    no report gives a figure (GPU figures only from reports run on a GPU)."""
    del config  # accepted like every command's; the plan reads reports, not settings
    from pipeline.tools.capacity import CapacityTarget, capacity_plan, render

    try:
        target = CapacityTarget(events_per_s, candidates, p99_ms, utilisation)
        plan = capacity_plan([(path.name, _read(path)) for path in reports], target)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    if as_json:
        emit(plan.as_dict(), as_json)
    else:
        sys.stdout.write(render(plan) + "\n")


def _read(path: Path) -> dict[str, Any]:
    """The last line of a ``--json`` report (a file may hold the command's whole stdout)."""
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        report = json.loads(lines[-1]) if lines else None
    except OSError as exc:
        raise UserError(f"--from {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise UserError(f"--from {path}: not a JSON report ({exc.msg})") from exc
    if not isinstance(report, dict):
        raise UserError(f"--from {path}: not a JSON report (expected an object)")
    return report
