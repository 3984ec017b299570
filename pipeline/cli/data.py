"""Data on the stack: ``produce`` events, ``consume`` recommendations, ``seed-features``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipeline.cli.checks import (
    require_configured_model,
    require_kafka,
    require_redis,
    require_schema_registry,
)
from pipeline.cli.common import ConfigOption, command_settings, progress_console, say
from pipeline.cli.errors import UserError
from pipeline.settings.secrets import mask_url


def produce(
    ctx: typer.Context,
    events: Annotated[int, typer.Option("--events", "-n", help="Valid events to send.")] = 1000,
    rate: Annotated[float | None, typer.Option(help="Events per second (default: max).")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (default: random).")] = None,
    malformed: Annotated[
        int, typer.Option(help="Also send this many malformed messages (they go to the DLQ).")
    ] = 0,
    wait_for_group: Annotated[
        bool,
        typer.Option(
            "--wait-for-group",
            help="Start sending only once the consumer group (kafka.group_id) owns every "
            "partition of the input topic: latency then excludes the pipeline's start-up.",
        ),
    ] = False,
    wait_timeout: Annotated[
        float, typer.Option(help="With --wait-for-group: give up after this many seconds.")
    ] = 300.0,
    config: ConfigOption = None,
) -> None:
    """Produce synthetic UserEvents (the synthetic world of the config) to the input topic; with
    [model.module] and [events], records of your schema synthesized from it."""
    from pipeline.tools.consumer_group import GroupNotReadyError, wait_for_assignment
    from pipeline.tools.synthetic_io import build_world, produce_events

    settings = command_settings(ctx, config)
    require_kafka(settings.kafka)
    require_schema_registry(settings.codec)
    synthesized = settings.model.module is not None and settings.events.configured
    if synthesized:
        require_configured_model(settings)
        if malformed:
            raise UserError("--malformed sends malformed UserEvents: not with [events]")
    console = progress_console(ctx)
    topic = settings.topics.input
    if wait_for_group:
        group, topic = settings.kafka.group_id, settings.topics.input
        try:
            wait_for_assignment(settings.kafka, group, topic, wait_timeout)
        except GroupNotReadyError as exc:
            raise UserError(f"{exc}: is `streamrank run` running with this config?") from exc
    with Progress(
        TextColumn("producing"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=console is None,
    ) as progress:
        task = progress.add_task("produce", total=events)
        if synthesized:
            from pipeline.tools.bench.event_source import produce_records

            count = produce_records(
                settings,
                events,
                rate=rate,
                seed=seed if seed is not None else int.from_bytes(os.urandom(4)),
                progress=lambda n: progress.advance(task, n),
            )
            say(f"produced {count} events of {settings.events.schema_file} to {topic}")
            return
        sent = produce_events(
            settings,
            build_world(settings),
            events,
            rate=rate,
            seed=seed,
            malformed=malformed,
            progress=lambda n: progress.advance(task, n),
            keep_records=False,
        )
    say(
        f"produced {sent.events} events and {sent.malformed} malformed messages "
        f"to {settings.topics.input}"
    )


def consume(
    ctx: typer.Context,
    max_records: Annotated[int | None, typer.Option("--max", help="Stop after N.")] = None,
    timeout: Annotated[float, typer.Option(help="Stop after S seconds without a record.")] = 10.0,
    config: ConfigOption = None,
) -> None:
    """Print Recommendations (or the records of your [output] schema) from the output topic as
    JSON lines."""
    from pipeline.tools.recommendation_reader import read_recommendations

    settings = command_settings(ctx, config)
    require_kafka(settings.kafka)
    require_schema_registry(settings.codec)
    for record in read_recommendations(settings, max_records=max_records, timeout_s=timeout):
        sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _require_input_file(path: Path | None, option: str) -> None:
    if path is not None and not path.is_file():
        raise UserError(f"{option}: file not found: {path}")


def seed_features(
    ctx: typer.Context,
    users: Annotated[Path | None, typer.Option(help="Users CSV/Parquet.")] = None,
    items: Annotated[Path | None, typer.Option(help="Items CSV/Parquet.")] = None,
    config: ConfigOption = None,
) -> None:
    """Write user and item features to Redis: synthetic, or from CSV/Parquet files."""
    from pipeline.connectors.redis.feature_store import FeatureStoreWriter
    from pipeline.tools.synthetic_io import (
        FeatureFileError,
        build_world,
        read_feature_files,
        redis_client,
        seed_world_features,
        write_feature_files,
    )

    _require_input_file(users, "--users")
    _require_input_file(items, "--items")
    settings = command_settings(ctx, config)
    files = None
    if users is not None or items is not None:
        try:  # every file is read and checked before anything is written
            files = read_feature_files(
                settings.model.user_dense_dim, settings.model.item_dense_dim, users, items
            )
        except FeatureFileError as exc:
            raise UserError(f"--{exc.which} {exc}") from exc
    require_redis(settings.redis)
    writer = FeatureStoreWriter(redis_client(settings), settings.redis.key_prefix)
    if files is None:
        n_users, n_items = seed_world_features(build_world(settings), writer)
        source = "synthetic world"
    else:
        n_users, n_items = write_feature_files(writer, files)
        source = "files"
    target = mask_url(settings.redis.url)
    say(f"seeded {n_users} users and {n_items} items from {source} into {target}")
