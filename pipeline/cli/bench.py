"""``streamrank bench model|pipeline|quantize|compile|precision|ranks|overhead|ingest|codec|
retrieval|latency|soak|swap``: the numbers of BENCHMARKS.md; ``latency``, ``soak`` and ``swap``
offer a paced load to the pipeline over time (the latency figures, the soak of RELIABILITY.md, a
model swap under load).

Each command loads and checks its settings and options before it imports its tool (torch and
TorchRec): a user error is one line at once.

Without a checkpoint, ``model``, ``pipeline``, ``quantize`` and ``compile`` time an untrained
model of the configured spec (same shapes, same speed; a warning says so); ``ranks`` runs
``streamrank run`` and needs a checkpoint.

With ``[model.module]`` (``-c FILE``), ``model``, ``pipeline``, ``overhead``, ``ingest`` (and
``latency``, ``soak``) measure the user's model: its events synthesized from its schema, its
Redis records from its layouts, its module with the current version of ``model.checkpoint``
(else freshly initialised weights; each report's ``model`` says which). The others measure the
built-in model only and refuse one (:func:`~pipeline.cli.bench_settings.builtin_only`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.bench_settings import (
    builtin_only,
    chosen_config,
    configured_model,
    export_config_file,
    model_settings,
    stack_settings,
)
from pipeline.cli.checks import require_checkpoint
from pipeline.cli.common import (
    ConfigOption,
    JsonOption,
    apply_threads,
    command_settings,
    emit,
    say,
    with_checkpoint,
)
from pipeline.cli.errors import UserError

bench_app = typer.Typer(help="Benchmarks (numbers for BENCHMARKS.md).", no_args_is_help=True)

BatchRowsOption = Annotated[
    int | None, typer.Option(help="Rows per forward (default batching.max_batch_rows).")
]


RoundSecondsOption = Annotated[
    float, typer.Option("--seconds", help="Seconds of timing per round and variant.")
]
RoundsOption = Annotated[int, typer.Option(help="Interleaved rounds.")]
KeepTopicsOption = Annotated[
    bool,
    typer.Option(
        "--keep-topics", help="Keep the bench-events/recs/dlq-<id> topics the runs create."
    ),
]


@bench_app.command("model")
def bench_model_command(
    ctx: typer.Context,
    batch_rows: BatchRowsOption = None,
    seconds: Annotated[float, typer.Option(help="Seconds to measure for.")] = 5.0,
    replay_dir: Annotated[
        Path | None,
        typer.Option(
            "--replay",
            help="Replay the batches `bench pipeline --record DIR` recorded, alone, instead.",
        ),
    ] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Bare forward rows/s of the configured model at the configured batch size (or of the
    batches a `bench pipeline --record` drain recorded, replayed alone). With [model.module]:
    batches of its own input (events synthesized from its schema, records seeded into Redis)."""
    settings = model_settings(ctx, config, "model")
    if replay_dir is not None and not (replay_dir / "recording.json").is_file():
        raise UserError(f"--replay: {replay_dir} holds no recording (bench pipeline --record)")
    from pipeline.tools.bench.model import bench_model, describe_device
    from pipeline.tools.bench.served import bench_scorer, model_identity
    from pipeline.tools.bench.workload import workload

    with bench_scorer(settings) as (scorer, notes):
        if replay_dir is not None:
            from pipeline.tools.bench.replay import Recording, replay

            recording, recorded = Recording.load(replay_dir, scorer.device)
            result = {
                **replay(scorer, recording, seconds).as_dict(),
                "recorded_with": recorded["recorded_with"],
                "recorded_model_version": recorded.get("model_version"),
            }
        else:
            rows = batch_rows or settings.batching.max_batch_rows
            load = workload(settings, seed_redis=False)  # a configured model's: into Redis
            result = bench_model(scorer, load, rows, seconds).as_dict()
        result["model_version"] = scorer.model_version
        result["model"] = model_identity(settings, scorer.model_version)
        result["notes"] = notes
        result.update(describe_device(scorer.device))
    emit(result, as_json)


@bench_app.command("pipeline")
def bench_pipeline_command(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Events per batched end-to-end run.")] = 5000,
    per_event_events: Annotated[
        int, typer.Option(help="Events per one-event-per-batch run (0 skips it).")
    ] = 500,
    rounds: RoundsOption = 3,
    model_seconds: Annotated[
        float, typer.Option(help="Seconds of bare forward timing per round.")
    ] = 3.0,
    keep_topics: KeepTopicsOption = False,
    record: Annotated[
        Path | None,
        typer.Option(
            help="Save the first batched run's batches here (replay: bench model --replay)."
        ),
    ] = None,
    variant: Annotated[
        list[str] | None,
        typer.Option(
            help="section.key=value (repeatable): each round also drains the same backlog with "
            "these settings, e.g. retrieval.enabled=false (variant_over_e2e: interleaved pairs)."
        ),
    ] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Bare forward vs end-to-end rows/s (batched and per event), interleaved on the stack, of
    the pipeline `streamrank run` builds; each batched run's batches replayed alone, its CPU per
    thread and process."""
    settings = stack_settings(ctx, config, "pipeline")
    from pipeline.tools.bench.overrides import with_override

    changed = None
    for assignment in variant or ():
        try:
            changed = with_override(changed or settings, assignment)
        except ValueError as exc:
            raise UserError(f"--variant {exc}") from exc
    from pipeline.tools.bench.pipeline import bench_pipeline

    apply_threads(settings)
    result = bench_pipeline(
        settings,
        events=events,
        per_event_events=per_event_events,
        rounds=rounds,
        model_seconds=model_seconds,
        report=say,
        keep_topics=keep_topics,
        record=record,
        variant=changed,
        variant_changes=tuple(variant or ()),
    )
    emit(result.as_dict(), as_json)


@bench_app.command("quantize")
def bench_quantize_command(
    ctx: typer.Context,
    batch_rows: Annotated[int, typer.Option(help="Rows per forward.")] = 1024,
    seconds: Annotated[float, typer.Option(help="Seconds of timing per model and dtype.")] = 3.0,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """fp16/int8 embedding tables vs fp32: bytes, max score change, forward rows/s."""
    settings = model_settings(ctx, config, "quantize")
    from pipeline.tools.bench.serving import bench_quantization

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
    settings = model_settings(ctx, config, "compile")
    from pipeline.tools.bench.serving import bench_compile

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
    settings = model_settings(ctx, config, "precision")
    from pipeline.tools.bench.serving import bench_precision

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
    keep_topics: KeepTopicsOption = False,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """End-to-end rows/s with 1 vs N ranks, embedding bytes and step times per rank."""
    try:
        nprocs = tuple(int(n) for n in nproc.split(","))
    except ValueError as exc:
        raise UserError(f"--nproc takes world sizes like 1,2,4; got {nproc!r}") from exc
    if not nprocs or min(nprocs) < 1:
        raise UserError(f"--nproc takes world sizes >= 1, got {nproc!r}")
    settings = stack_settings(ctx, config, "ranks")
    settings = with_checkpoint(settings, require_checkpoint(settings.model.checkpoint))
    from pipeline.tools.bench.ranks import bench_ranks

    export_config_file(ctx, config)
    emit(
        bench_ranks(settings, events, rounds, nprocs, report=say, keep_topics=keep_topics),
        as_json,
    )


@bench_app.command("overhead")
def bench_overhead_command(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Events produced once, read by both runs.")] = 20000,
    keep_topics: KeepTopicsOption = False,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """CPU per event around the model: Kafka passthrough vs the pipeline with a tiny ranker."""
    settings = stack_settings(ctx, config, "overhead")
    from pipeline.tools.bench.overhead import bench_overhead

    emit(bench_overhead(settings, events=events, report=say, keep_topics=keep_topics), as_json)


@bench_app.command("ingest")
def bench_ingest_command(
    ctx: typer.Context,
    workers: Annotated[
        str, typer.Option(help="Ingest workers to compare, comma-separated (0: one process).")
    ] = "0,1,2",
    events: Annotated[int, typer.Option(help="Events per run.")] = 20000,
    rounds: RoundsOption = 3,
    keep_topics: KeepTopicsOption = False,
    versus: Annotated[
        Path | None,
        typer.Option(
            help="Also run the model of this config file after each run, same workers and "
            "events (interleaved; e.g. a file without [model.module]: the built-in model).",
        ),
    ] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """One process vs K ingest workers: events/s, CPU per event of each process, transport."""
    try:
        counts = tuple(int(k) for k in workers.split(","))
    except ValueError as exc:
        raise UserError(f"--workers takes worker counts like 0,1,2; got {workers!r}") from exc
    if not counts or min(counts) < 0 or events < 1 or rounds < 1:
        raise UserError("--workers must be >= 0; --events and --rounds >= 1")
    if versus is not None and not versus.is_file():
        raise UserError(f"--versus: file not found: {versus}")

    settings = stack_settings(ctx, config, "ingest")
    if settings.model.module is None:  # a configured model without a version runs untrained
        settings = with_checkpoint(settings, require_checkpoint(settings.model.checkpoint))
    other = None
    if versus is not None:
        from pipeline.settings.loading import load_settings

        other = (configured_model(load_settings(versus)), versus.resolve())
    from pipeline.tools.bench.ingest import bench_ingest

    export_config_file(ctx, config)
    result = bench_ingest(
        settings,
        workers=counts,
        events=events,
        rounds=rounds,
        report=say,
        keep_topics=keep_topics,
        config_file=chosen_config(ctx, config),
        versus=other,
    )
    emit(result, as_json)


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
    settings = builtin_only(command_settings(ctx, config), "codec")
    from pipeline.tools.bench.codec import bench_codec

    emit(bench_codec(settings, events=events, batch_events=batch_events, rounds=rounds), as_json)


@bench_app.command("retrieval")
def bench_retrieval_command(
    ctx: typer.Context,
    items: Annotated[
        int, typer.Option(help="Catalogue size (0: the model's item table rows).")
    ] = 0,
    queries: Annotated[int, typer.Option(help="Users queried.")] = 1000,
    batch: Annotated[int, typer.Option(help="Queries per search call.")] = 64,
    k: Annotated[int, typer.Option("--k", help="Results per query (recall@k).")] = 100,
    nprobe: Annotated[
        str, typer.Option(help="IVF cells scanned, e.g. 16,32,64 (default retrieval.nprobe).")
    ] = "",
    threads: Annotated[
        int | None, typer.Option(help="Faiss threads (default retrieval.threads).")
    ] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """IVFPQ vs exact inner-product search: recall@k, ms per event, index build time (no stack)."""
    settings = model_settings(ctx, config, "retrieval")
    try:
        nprobes = tuple(int(n) for n in nprobe.split(",")) if nprobe else ()
    except ValueError as exc:
        raise UserError(f"--nprobe takes cell counts like 16,32,64; got {nprobe!r}") from exc
    if min((items, queries - 1, batch - 1, k - 1, *nprobes), default=0) < 0 or 0 in nprobes:
        raise UserError("--items must be >= 0; --queries, --batch, --k and --nprobe >= 1")
    retrieval_config = settings.retrieval.config
    if threads is not None:
        try:
            retrieval_config = dataclasses.replace(retrieval_config, threads=threads)
        except ValueError as exc:
            raise UserError(f"--threads: {exc}") from exc
    from pipeline.tools.bench.retrieval import bench_retrieval

    emit(bench_retrieval(settings, retrieval_config, items, queries, batch, k, nprobes), as_json)


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
    from pipeline.tools.bench.soak.plan import SoakPlan
    from pipeline.tools.bench.soak.run import bench_soak

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
