"""``streamrank`` command line: run the pipeline, and the tools around it."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.config import Settings, load_settings

if TYPE_CHECKING:
    from pipeline.runner import RunSummary

app = typer.Typer(
    help="Real-time recommendation scoring: Kafka -> Redis features -> TorchRec DLRM -> Kafka.",
    no_args_is_help=True,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks (numbers for BENCHMARKS.md).", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

err = Console(stderr=True)
log = logging.getLogger("streamrank")


def _settings(ctx: typer.Context) -> Settings:
    settings: Settings = ctx.obj
    return settings


@app.callback()
def main(
    ctx: typer.Context,
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help="TOML config file.", exists=True)
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING...")] = "INFO",
) -> None:
    # Our loggers at the chosen level; third-party ones (fbgemm prints a line per library it
    # loads) only from WARNING.
    logging.basicConfig(
        level=logging.WARNING,
        format="%(name)s: %(message)s",
        handlers=[RichHandler(console=err, show_path=False, rich_tracebacks=True)],
    )
    for name in ("pipeline", "model", "streamrank"):
        logging.getLogger(name).setLevel(log_level.upper())
    ctx.obj = load_settings(config)


def _apply_threads(settings: Settings) -> None:
    import torch

    if settings.model.num_threads > 0:
        torch.set_num_threads(settings.model.num_threads)


@app.command()
def run(
    ctx: typer.Context,
    exit_when_idle: Annotated[
        float | None,
        typer.Option(
            help="Stop cleanly after this many seconds without input "
            "(counted once the group has assigned partitions; with several ranks, all idle)."
        ),
    ] = None,
    max_events: Annotated[int | None, typer.Option(help="Stop after consuming this many.")] = None,
    summary_json: Annotated[
        Path | None, typer.Option(help="Also write the run summary to this JSON file.")
    ] = None,
    nproc: Annotated[
        int, typer.Option(help="Ranks: >1 shards the model across ranks through torchrun.")
    ] = 1,
    max_restarts: Annotated[
        int, typer.Option(help="With --nproc > 1: times torchrun restarts the ranks.")
    ] = 3,
) -> None:
    """Consume UserEvents, score them, produce Recommendations (until stopped)."""
    from pipeline.distributed import in_torchrun, run_rank, summary_path, torchrun_command

    settings = _settings(ctx)
    _apply_threads(settings)
    if nproc > 1 and not in_torchrun():
        command = torchrun_command(nproc, _drop_option(sys.argv[1:], "--nproc"), max_restarts)
        log.info("starting %d ranks: %s", nproc, " ".join(command))
        raise typer.Exit(subprocess.call(command))
    if in_torchrun():
        summary = run_rank(settings, exit_when_idle, max_events)
    else:
        summary = _run_single(settings, exit_when_idle, max_events)
    result = summary.as_dict()
    out = summary_path(summary_json)
    if out is not None:
        out.write_text(json.dumps(result, indent=2))
    err.print(json.dumps(result))
    if in_torchrun():
        # gloo ranks occasionally abort in interpreter teardown after a clean run
        # (pytorch/pytorch#190489); the work is done and committed, so leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _drop_option(args: list[str], name: str) -> list[str]:
    """Remove ``name VALUE`` / ``name=VALUE`` from a command line."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def _run_single(
    settings: Settings, exit_when_idle: float | None, max_events: int | None
) -> RunSummary:
    from pipeline.metrics import Metrics
    from pipeline.runner import ScoringPipeline
    from pipeline.score import Scorer

    metrics = Metrics()
    if settings.metrics.enabled:
        metrics.serve(settings.metrics.host, settings.metrics.port)
    model = settings.model
    scorer = Scorer.from_checkpoint(model.checkpoint, model.device, model.quantize, model.compile)
    metrics.embedding_bytes.set(scorer.embedding_bytes())
    pipeline = ScoringPipeline(settings, scorer, metrics)
    pipeline.stop_on_signals()
    log.info(
        "scoring %s -> %s (dlq %s) with model %s",
        settings.topics.input,
        settings.topics.output,
        settings.topics.dlq,
        scorer.model_version,
    )
    return pipeline.run(exit_when_idle_s=exit_when_idle, max_events=max_events)


@app.command()
def plan(
    ctx: typer.Context,
    nproc: Annotated[int, typer.Option(help="Ranks to plan for.")] = 2,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Print the sharding plan (table, type, kernel, ranks, bytes per rank); runs nothing."""
    from model.checkpoint import load_spec
    from model.sharding import ShardingConfig, describe_plan, plan_sharding

    settings = _settings(ctx)
    checkpoint = settings.model.checkpoint
    spec = (
        load_spec(checkpoint)
        if (checkpoint / "meta.json").exists()
        else settings.model.feature_spec()
    )
    sharding_plan = plan_sharding(
        spec,
        nproc,
        device,
        ShardingConfig.parse(settings.model.sharding),
        batch_rows=settings.batching.max_batch_rows,
    )
    report = describe_plan(sharding_plan, spec, nproc)
    sys.stdout.write((json.dumps(report.as_dict()) if as_json else report.render()) + "\n")


@app.command()
def produce(
    ctx: typer.Context,
    events: Annotated[int, typer.Option("--events", "-n", help="Valid events to send.")] = 1000,
    rate: Annotated[float | None, typer.Option(help="Events per second (default: max).")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (default: random).")] = None,
    malformed: Annotated[
        int, typer.Option(help="Also send this many malformed messages (they go to the DLQ).")
    ] = 0,
) -> None:
    """Produce synthetic UserEvents (the synthetic world of the config) to the input topic."""
    from pipeline.tools.synthetic_io import build_world, produce_events

    settings = _settings(ctx)
    world = build_world(settings)
    with Progress(
        TextColumn("producing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
    ) as progress:
        task = progress.add_task("produce", total=events)
        sent = produce_events(
            settings,
            world,
            events,
            rate=rate,
            seed=seed,
            malformed=malformed,
            progress=lambda n: progress.advance(task, n),
        )
    err.print(
        f"produced {len(sent.records)} events and {sent.malformed} malformed messages "
        f"to {settings.topics.input}"
    )


@app.command()
def consume(
    ctx: typer.Context,
    max_records: Annotated[int | None, typer.Option("--max", help="Stop after N.")] = None,
    timeout: Annotated[float, typer.Option(help="Stop after S seconds without a record.")] = 10.0,
) -> None:
    """Print Recommendations from the output topic as JSON lines."""
    from pipeline.tools.recommendation_reader import read_recommendations

    settings = _settings(ctx)
    for record in read_recommendations(settings, max_records=max_records, timeout_s=timeout):
        sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


@app.command("seed-features")
def seed_features(
    ctx: typer.Context,
    users: Annotated[Path | None, typer.Option(help="Users CSV/Parquet.", exists=True)] = None,
    items: Annotated[Path | None, typer.Option(help="Items CSV/Parquet.", exists=True)] = None,
) -> None:
    """Write user and item features to Redis: synthetic, or from CSV/Parquet files."""
    from pipeline.feature_store import FeatureStoreWriter
    from pipeline.tools.synthetic_io import (
        build_world,
        redis_client,
        seed_file_features,
        seed_world_features,
    )

    settings = _settings(ctx)
    writer = FeatureStoreWriter(redis_client(settings), settings.redis.key_prefix)
    if users is None and items is None:
        n_users, n_items = seed_world_features(build_world(settings), writer)
        source = "synthetic world"
    else:
        n_users, n_items = seed_file_features(
            writer, settings.model.user_dense_dim, settings.model.item_dense_dim, users, items
        )
        source = "files"
    err.print(f"seeded {n_users} users and {n_items} items from {source} into {settings.redis.url}")


@app.command("init-model")
def init_model(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Synthetic training events.")] = 20_000,
    epochs: Annotated[int, typer.Option(help="Passes over them.")] = 1,
    out: Annotated[
        Path | None, typer.Option(help="Checkpoint dir (default model.checkpoint).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Training seed.")] = 0,
) -> None:
    """Train the configured DLRM briefly on synthetic interactions and save a checkpoint."""
    from model.checkpoint import save_checkpoint
    from model.train import train_ranker
    from pipeline.tools.synthetic_io import build_world

    settings = _settings(ctx)
    _apply_threads(settings)
    spec = settings.model.feature_spec()
    result = train_ranker(
        spec,
        build_world(settings),
        num_events=events,
        epochs=epochs,
        seed=seed,
        log=lambda msg: err.print(msg),
    )
    path = out or settings.model.checkpoint
    meta = save_checkpoint(
        result.ranker, spec, path, metrics={"auc": result.auc, "train_loss": result.train_loss}
    )
    err.print(
        f"held-out AUC {result.auc:.4f} after {result.seconds:.1f}s on {result.rows} rows; "
        f"saved {meta.model_version} to {path}"
    )


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        for key, value in result.items():
            err.print(f"{key}: {value}")


@bench_app.command("model")
def bench_model_cmd(
    ctx: typer.Context,
    batch_rows: Annotated[
        int | None, typer.Option(help="Rows per forward (default batching.max_batch_rows).")
    ] = None,
    seconds: Annotated[float, typer.Option(help="Measure for this long.")] = 5.0,
    as_json: Annotated[bool, typer.Option("--json", help="Last line: a JSON object.")] = False,
) -> None:
    """Bare forward rows/s of the configured model at the configured batch size."""
    from pipeline.tools.bench.common import load_or_build_scorer
    from pipeline.tools.bench.model import bench_model
    from pipeline.tools.synthetic_io import build_world

    settings = _settings(ctx)
    _apply_threads(settings)
    scorer = load_or_build_scorer(settings)
    rows = batch_rows or settings.batching.max_batch_rows
    result = bench_model(scorer, build_world(settings), rows, seconds).as_dict()
    result["model_version"] = scorer.model_version
    _emit(result, as_json)


@bench_app.command("pipeline")
def bench_pipeline_cmd(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Events per batched end-to-end run.")] = 5000,
    per_event_events: Annotated[
        int, typer.Option(help="Events per one-event-per-batch run (0 skips it).")
    ] = 500,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds.")] = 3,
    model_seconds: Annotated[float, typer.Option(help="Bare forward timing per round.")] = 3.0,
    as_json: Annotated[bool, typer.Option("--json", help="Last line: a JSON object.")] = False,
) -> None:
    """Bare forward vs end-to-end rows/s (batched and per event), interleaved on the stack."""
    from pipeline.tools.bench.pipeline import bench_pipeline

    settings = _settings(ctx)
    _apply_threads(settings)
    result = bench_pipeline(
        settings,
        events=events,
        per_event_events=per_event_events,
        rounds=rounds,
        model_seconds=model_seconds,
        report=lambda line: err.print(line),
    )
    _emit(result.as_dict(), as_json)


@bench_app.command("quantize")
def bench_quantize_cmd(
    ctx: typer.Context,
    batch_rows: Annotated[int, typer.Option(help="Rows per forward.")] = 1024,
    seconds: Annotated[float, typer.Option(help="Timing per model and dtype.")] = 3.0,
    as_json: Annotated[bool, typer.Option("--json", help="Last line: a JSON object.")] = False,
) -> None:
    """fp16/int8 embedding tables vs fp32: bytes, max score change, forward rows/s."""
    from pipeline.tools.bench.serving import bench_quantization

    settings = _settings(ctx)
    _apply_threads(settings)
    _emit({"quantization": bench_quantization(settings, batch_rows, seconds)}, as_json)


@bench_app.command("compile")
def bench_compile_cmd(
    ctx: typer.Context,
    batch_rows: Annotated[
        int | None, typer.Option(help="Rows per forward (default batching.max_batch_rows).")
    ] = None,
    seconds: Annotated[float, typer.Option(help="Timing per round and variant.")] = 3.0,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Last line: a JSON object.")] = False,
) -> None:
    """Forward rows/s with and without torch.compile (interleaved)."""
    from pipeline.tools.bench.serving import bench_compile

    settings = _settings(ctx)
    _apply_threads(settings)
    rows = batch_rows or settings.batching.max_batch_rows
    _emit(bench_compile(settings, rows, seconds, rounds), as_json)


@bench_app.command("ranks")
def bench_ranks_cmd(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Events per run.")] = 5000,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds of 1 and 2 ranks.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Last line: a JSON object.")] = False,
) -> None:
    """End-to-end rows/s with 1 vs 2 ranks, and embedding bytes per rank."""
    from pipeline.tools.bench.ranks import bench_ranks

    settings = _settings(ctx)
    result = bench_ranks(settings, events, rounds, report=lambda line: err.print(line))
    _emit(result, as_json)


if __name__ == "__main__":
    app()
