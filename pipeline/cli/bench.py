"""``streamrank bench model|pipeline|quantize|compile|precision|ranks|overhead|codec|latency``:
the numbers of BENCHMARKS.md.

Without a checkpoint, ``model``, ``pipeline``, ``quantize`` and ``compile`` time an untrained
model of the configured spec (same shapes, same speed; a warning says so); ``ranks`` runs
``streamrank run`` and needs a checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.checks import require_checkpoint, require_kafka, require_redis
from pipeline.cli.common import ConfigOption, JsonOption, apply_threads, command_settings, emit
from pipeline.cli.common import err as console
from pipeline.cli.errors import UserError
from pipeline.config import Settings

bench_app = typer.Typer(help="Benchmarks (numbers for BENCHMARKS.md).", no_args_is_help=True)

BatchRowsOption = Annotated[
    int | None, typer.Option(help="Rows per forward (default batching.max_batch_rows).")
]


RoundSecondsOption = Annotated[float, typer.Option(help="Timing per round and variant.")]
RoundsOption = Annotated[int, typer.Option(help="Interleaved rounds.")]


def _model_settings(ctx: typer.Context, config: ConfigOption) -> Settings:
    """Settings for a forward-only bench (no stack needed), torch threads applied."""
    settings = command_settings(ctx, config)
    apply_threads(settings)
    return settings


def _report(line: str) -> None:
    console.print(line)


def _stack_settings(ctx: typer.Context, config: ConfigOption) -> Settings:
    """Settings of a benchmark on the stack, after checking Kafka and Redis answer."""
    settings = command_settings(ctx, config)
    require_kafka(settings.kafka)
    require_redis(settings.redis)
    return settings


@bench_app.command("model")
def bench_model_command(
    ctx: typer.Context,
    batch_rows: BatchRowsOption = None,
    seconds: Annotated[float, typer.Option(help="Measure for this long.")] = 5.0,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Bare forward rows/s of the configured model at the configured batch size."""
    from pipeline.tools.bench.common import load_or_build_scorer
    from pipeline.tools.bench.model import bench_model
    from pipeline.tools.synthetic_io import build_world

    settings = _model_settings(ctx, config)
    scorer = load_or_build_scorer(settings)
    rows = batch_rows or settings.batching.max_batch_rows
    result = bench_model(scorer, build_world(settings), rows, seconds).as_dict()
    result["model_version"] = scorer.model_version
    emit(result, as_json)


@bench_app.command("pipeline")
def bench_pipeline_command(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Events per batched end-to-end run.")] = 5000,
    per_event_events: Annotated[
        int, typer.Option(help="Events per one-event-per-batch run (0 skips it).")
    ] = 500,
    rounds: RoundsOption = 3,
    model_seconds: Annotated[float, typer.Option(help="Bare forward timing per round.")] = 3.0,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Bare forward vs end-to-end rows/s (batched and per event), interleaved on the stack."""
    from pipeline.tools.bench.pipeline import bench_pipeline

    settings = _stack_settings(ctx, config)
    apply_threads(settings)
    result = bench_pipeline(
        settings,
        events=events,
        per_event_events=per_event_events,
        rounds=rounds,
        model_seconds=model_seconds,
        report=_report,
    )
    emit(result.as_dict(), as_json)


@bench_app.command("quantize")
def bench_quantize_command(
    ctx: typer.Context,
    batch_rows: Annotated[int, typer.Option(help="Rows per forward.")] = 1024,
    seconds: Annotated[float, typer.Option(help="Timing per model and dtype.")] = 3.0,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """fp16/int8 embedding tables vs fp32: bytes, max score change, forward rows/s."""
    from pipeline.tools.bench.serving import bench_quantization

    settings = _model_settings(ctx, config)
    emit({"quantization": bench_quantization(settings, batch_rows, seconds)}, as_json)


@bench_app.command("compile")
def bench_compile_command(
    ctx: typer.Context,
    batch_rows: BatchRowsOption = None,
    seconds: RoundSecondsOption = 3.0,
    rounds: RoundsOption = 3,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Forward rows/s with and without torch.compile (interleaved)."""
    from pipeline.tools.bench.serving import bench_compile

    settings = _model_settings(ctx, config)
    rows = batch_rows or settings.batching.max_batch_rows
    emit(bench_compile(settings, rows, seconds, rounds), as_json)


@bench_app.command("precision")
def bench_precision_command(
    ctx: typer.Context,
    batch_rows: BatchRowsOption = None,
    seconds: RoundSecondsOption = 3.0,
    rounds: RoundsOption = 3,
    compile_too: Annotated[
        bool, typer.Option("--compile", help="Also each precision compiled (model.compile_mode).")
    ] = False,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Forward rows/s of fp32, tf32 and bf16 (and compiled), max score change vs fp32."""
    from pipeline.tools.bench.serving import bench_precision

    settings = _model_settings(ctx, config)
    rows = batch_rows or settings.batching.max_batch_rows
    emit(bench_precision(settings, rows, seconds, rounds, compile_too), as_json)


@bench_app.command("ranks")
def bench_ranks_command(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Events per run.")] = 5000,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds over the world sizes.")] = 2,
    nproc: Annotated[
        str, typer.Option(help="World sizes to compare, comma-separated; the first is the base.")
    ] = "1,2",
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """End-to-end rows/s with 1 vs N ranks, embedding bytes and step times per rank."""
    from pipeline.tools.bench.ranks import bench_ranks

    try:
        nprocs = tuple(int(n) for n in nproc.split(","))
    except ValueError as exc:
        raise UserError(f"--nproc takes world sizes like 1,2,4; got {nproc!r}") from exc
    if not nprocs or min(nprocs) < 1:
        raise UserError(f"--nproc takes world sizes >= 1, got {nproc!r}")
    settings = _stack_settings(ctx, config)
    require_checkpoint(settings.model.checkpoint)
    emit(bench_ranks(settings, events, rounds, nprocs, report=_report), as_json)


@bench_app.command("overhead")
def bench_overhead_command(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Events produced once, read by both runs.")] = 20000,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """CPU per event around the model: Kafka passthrough vs the pipeline with a tiny ranker."""
    from pipeline.tools.bench.overhead import bench_overhead

    settings = _stack_settings(ctx, config)
    emit(bench_overhead(settings, events=events, report=_report), as_json)


@bench_app.command("codec")
def bench_codec_command(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Synthetic events per round.")] = 7000,
    batch_events: Annotated[int, typer.Option(help="Events per decoded batch.")] = 70,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds.")] = 3,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """fastavro per event vs the columnar kernels: decode and encode CPU per event (no stack)."""
    from pipeline.tools.bench.codec import bench_codec

    settings = command_settings(ctx, config)
    emit(bench_codec(settings, events=events, batch_events=batch_events, rounds=rounds), as_json)


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
    if plot is not None and not plot.parent.is_dir():
        raise UserError(f"--plot: no such directory: {plot.parent}")
    if compare is not None and plot is None:
        raise UserError("--compare draws on the plot: give --plot FILE.png too")
    earlier = _previous_report(compare) if compare is not None else None
    from pipeline.tools.bench.latency import bench_latency
    from pipeline.tools.bench.latency_plot import plot_latency

    settings = _stack_settings(ctx, config)
    apply_threads(settings)
    result = bench_latency(
        settings,
        loads=fractions,
        seconds=seconds,
        capacity_events=capacity_events,
        warmup_s=warmup_seconds,
        report=_report,
    )
    if plot is not None:
        runs = [("this run", result)]
        if earlier is not None and compare is not None:
            runs.append((compare.stem, earlier))
        _report(f"plot: {plot_latency(runs, plot)}")
    emit(result, as_json)
