"""``streamrank bench latency|soak|swap``: a paced load offered to the pipeline over time (the
latency figures of BENCHMARKS.md, the soak of RELIABILITY.md, a model swap under load).

Both register on :data:`pipeline.cli.bench.bench_app`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.bench import bench_app
from pipeline.cli.bench_settings import export_config_file, stack_settings
from pipeline.cli.checks import require_checkpoint
from pipeline.cli.common import ConfigOption, JsonOption, apply_threads, emit, say
from pipeline.cli.errors import UserError


@bench_app.command("soak")
def bench_soak_command(
    ctx: typer.Context,
    minutes: Annotated[float, typer.Option(help="How long to offer load.")] = 10.0,
    load: Annotated[float, typer.Option(help="Fraction of the measured capacity to offer.")] = 0.5,
    rate: Annotated[
        float | None, typer.Option(help="Events/s to offer instead (skips the capacity run).")
    ] = None,
    capacity_events: Annotated[
        int, typer.Option(help="Backlog scored to measure the capacity.")
    ] = 20_000,
    sample_s: Annotated[float, typer.Option(help="Seconds between samples.")] = 30.0,
    warmup_s: Annotated[
        float | None,
        typer.Option(help="Samples before this are not checked (default: 60 s, at most 20%)."),
    ] = None,
    max_growth_24h: Annotated[
        float,
        typer.Option(
            "--max-growth-24h",
            help="Largest RSS growth over 24 h, projected by the slope after warm-up, that "
            "passes (a fraction).",
        ),
    ] = 0.10,
    max_lag_s: Annotated[
        float, typer.Option(help="Lag bound after warm-up, in seconds of offered input.")
    ] = 10.0,
    out: Annotated[Path, typer.Option(help="Directory for soak.json, soak.png and logs.")] = Path(
        "artifacts/soak"
    ),
    trace: Annotated[
        bool,
        typer.Option(
            "--trace",
            help="Run the pipeline under a tracer: GC pauses, allocator and RSS every second "
            "(trace.jsonl; its summary in soak.json).",
        ),
    ] = False,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """A long run at a fraction of capacity: RSS, lag and p99 sampled and plotted; checks that
    memory stays flat, lag stays bounded and nothing is lost (exit 1 when a check fails)."""
    if minutes <= 0 or sample_s <= 0 or capacity_events < 1:
        raise UserError("--minutes, --sample-s and --capacity-events must be positive")
    if not 0 < load <= 1:
        raise UserError(f"--load is a fraction of capacity in (0, 1], got {load}")
    if rate is not None and rate <= 0:
        raise UserError(f"--rate must be positive, got {rate}")
    settings = stack_settings(ctx, config, "soak")
    if settings.model.module is None:  # a configured model without a version runs untrained
        require_checkpoint(settings.model.checkpoint)
    from pipeline.tools.bench.soak import SoakPlan, bench_soak

    export_config_file(ctx, config)
    plan = SoakPlan(
        minutes=minutes,
        load=load,
        rate=rate,
        capacity_events=capacity_events,
        sample_s=sample_s,
        warmup_s=min(60.0, minutes * 60 * 0.2) if warmup_s is None else warmup_s,
        max_growth_24h=max_growth_24h,
        max_lag_s=max_lag_s,
        trace=trace,
    )
    result = bench_soak(settings, plan, out, report=say)
    emit({k: v for k, v in result.items() if k != "samples"} if not as_json else result, as_json)
    if not result["passed"]:
        failed = [name for name, ok in result["checks"].items() if not ok]
        say(f"soak checks failed: {', '.join(failed)} (see {result['json']})")
        raise typer.Exit(1)


def parse_loads(text: str) -> tuple[float, ...]:
    """``"0.25,0.5"`` -> ``(0.25, 0.5)``; fractions of capacity in (0, 2].

    Raises:
        UserError: not a comma-separated list of such fractions.
    """
    try:
        loads = tuple(float(part) for part in text.split(","))
    except ValueError as exc:
        raise UserError(f"--loads takes fractions of capacity like 0.25,0.5; got {text!r}") from exc
    if not all(0 < load <= 2 for load in loads):
        raise UserError(f"--loads takes fractions of capacity in (0, 2], got {text!r}")
    return loads


def _previous_report(path: Path) -> dict[str, Any]:
    """A ``bench latency --json`` report to compare with (its last JSON line)."""
    try:
        lines = path.read_text().strip().splitlines()
        report = json.loads(lines[-1]) if lines else None
    except (OSError, ValueError) as exc:
        raise UserError(f"--compare: cannot read a JSON report from {path}: {exc}") from exc
    if not isinstance(report, dict) or "loads" not in report:
        raise UserError(f"--compare: {path} is not a `bench latency --json` report")
    return report


@bench_app.command("latency")
def bench_latency_command(
    ctx: typer.Context,
    loads: Annotated[
        str, typer.Option(help="Fractions of the measured capacity to offer, comma-separated.")
    ] = "0.25,0.5,0.75,0.9",
    seconds: Annotated[float, typer.Option(help="How long each load is offered.")] = 20.0,
    warmup_seconds: Annotated[
        float,
        typer.Option(help="Events sent in each load's first seconds are left out of latency."),
    ] = 1.0,
    capacity_events: Annotated[
        int, typer.Option(help="Backlog drained to measure capacity.")
    ] = 10_000,
    capacity_only: Annotated[
        bool, typer.Option("--capacity-only", help="Measure capacity only (no loads).")
    ] = False,
    plot: Annotated[
        Path | None, typer.Option(help="Also write p50/p99 vs offered load to this PNG.")
    ] = None,
    compare: Annotated[
        Path | None,
        typer.Option(help="With --plot: also draw this earlier `bench latency --json` report."),
    ] = None,
    busy_cores: Annotated[
        int,
        typer.Option(
            help="Run the loads beside this many busy processes (one core each), as on a "
            "shared host; capacity is measured before they start."
        ),
    ] = 0,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Capacity, then end-to-end latency at each offered load (producer in its own process)."""
    fractions = () if capacity_only else parse_loads(loads)
    if capacity_only and plot is not None:
        raise UserError("--capacity-only measures no loads: there is nothing to --plot")
    if seconds <= 0:
        raise UserError(f"--seconds must be > 0, got {seconds:g}")
    if not 0 <= warmup_seconds < seconds:
        raise UserError(
            f"--warmup-seconds must be >= 0 and below --seconds ({seconds:g}), "
            f"got {warmup_seconds:g}"
        )
    if capacity_events < 1:
        raise UserError(f"--capacity-events must be >= 1, got {capacity_events}")
    if not 0 <= busy_cores <= (os.cpu_count() or 1):
        raise UserError(
            f"--busy-cores must be between 0 and the host's {os.cpu_count()} cores, "
            f"got {busy_cores}"
        )
    if plot is not None and not plot.parent.is_dir():
        raise UserError(f"--plot: no such directory: {plot.parent}")
    if compare is not None and plot is None:
        raise UserError("--compare draws on the plot: give --plot FILE.png too")
    earlier = _previous_report(compare) if compare is not None else None
    settings = stack_settings(ctx, config, "latency")
    from pipeline.tools.bench.latency import bench_latency
    from pipeline.tools.bench.latency_plot import plot_latency

    apply_threads(settings)
    result = bench_latency(
        settings,
        loads=fractions,
        seconds=seconds,
        capacity_events=capacity_events,
        warmup_s=warmup_seconds,
        busy_cores=busy_cores,
        report=say,
    )
    if plot is not None:
        runs = [("this run", result)]
        if earlier is not None and compare is not None:
            runs.append((compare.stem, earlier))
        say(f"plot: {plot_latency(runs, plot)}")
    emit(result, as_json)


@bench_app.command("swap")
def bench_swap_command(
    ctx: typer.Context,
    rate: Annotated[float, typer.Option(help="Events/s offered.")] = 200.0,
    seconds: Annotated[float, typer.Option(help="How long the producer runs.")] = 30.0,
    swap_at: Annotated[float, typer.Option(help="Promote the new version after this.")] = 10.0,
    window_s: Annotated[
        float, typer.Option(help="Half-width of the window around the first new output.")
    ] = 2.0,
    nproc: Annotated[int, typer.Option(help="Ranks of the pipeline.")] = 1,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """A model version promoted under load: p50/p99 latency before, around and after the swap,
    nothing lost or repeated, every partition switching once (on the stack)."""
    if min(rate, seconds, window_s) <= 0 or nproc < 1:
        raise UserError("--rate, --seconds and --window-s must be positive, --nproc >= 1")
    if not 0 < swap_at < seconds:
        raise UserError(f"--swap-at must be inside (0, --seconds={seconds:g}), got {swap_at:g}")
    settings = stack_settings(ctx, config, "swap")
    from pipeline.tools.bench.swap import SwapPlan, bench_swap

    export_config_file(ctx, config)
    plan = SwapPlan(rate=rate, seconds=seconds, swap_at_s=swap_at, window_s=window_s, nproc=nproc)
    emit(bench_swap(settings, plan, report=say), as_json)
