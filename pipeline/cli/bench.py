"""``streamrank bench model|pipeline|quantize|compile|precision|ranks|overhead|ingest|codec|
retrieval``: the numbers of BENCHMARKS.md (the benchmarks that offer a load over time,
``latency``, ``soak`` and ``swap``, are in :mod:`pipeline.cli.bench_load`).

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
from pathlib import Path
from typing import Annotated

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
    retrieval_config = settings.retrieval.to_config()
    if threads is not None:
        try:
            retrieval_config = dataclasses.replace(retrieval_config, threads=threads)
        except ValueError as exc:
            raise UserError(f"--threads: {exc}") from exc
    from pipeline.tools.bench.retrieval import bench_retrieval

    emit(bench_retrieval(settings, retrieval_config, items, queries, batch, k, nprobes), as_json)
