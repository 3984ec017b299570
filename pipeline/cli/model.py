"""The model: ``init-model`` trains and saves one, ``plan`` prints its sharding plan."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.checks import require_free_checkpoint_path
from pipeline.cli.common import (
    ConfigOption,
    apply_threads,
    command_settings,
    configured_spec,
    say,
)


class PlanDevice(enum.StrEnum):
    """``plan --device``: the device type of the ranks planned for."""

    CPU = "cpu"
    CUDA = "cuda"


def init_model(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Synthetic training events.")] = 20_000,
    epochs: Annotated[int, typer.Option(help="Passes over them.")] = 1,
    out: Annotated[
        Path | None, typer.Option(help="Checkpoint dir (default model.checkpoint).")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Training seed (weights, shuffling and the held-out split).")
    ] = 0,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing checkpoint there.")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Train the configured DLRM briefly on synthetic interactions and save a checkpoint."""
    from model.checkpoint import save_checkpoint
    from model.train import train_ranker
    from pipeline.tools.synthetic_io import build_world

    settings = command_settings(ctx, config)
    path = out or settings.model.checkpoint
    require_free_checkpoint_path(path, overwrite)
    apply_threads(settings)
    spec = configured_spec(settings)
    result = train_ranker(
        spec,
        build_world(settings),
        num_events=events,
        epochs=epochs,
        seed=seed,
        log=say,
    )
    meta = save_checkpoint(
        result.ranker,
        spec,
        path,
        metrics={"auc": result.auc, "train_loss": result.train_loss},
        overwrite=overwrite,
    )
    say(
        f"held-out AUC {result.auc:.4f} after {result.seconds:.1f}s on {result.rows} rows; "
        f"saved {meta.model_version} to {path}"
    )


def plan(
    ctx: typer.Context,
    nproc: Annotated[int, typer.Option(help="Ranks to plan for.")] = 2,
    device: Annotated[
        PlanDevice,
        typer.Option(help="Device type of the ranks planned for (cuda: one GPU per rank)."),
    ] = PlanDevice.CPU,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    config: ConfigOption = None,
) -> None:
    """Print the sharding plan (table, type, kernel, ranks, bytes per rank); runs nothing.

    Plans the checkpoint's model when model.checkpoint holds one, else the model the [model]
    section describes (the one init-model would train).
    """
    from model.checkpoint import load_spec
    from model.distributed import describe_plan, plan_sharding

    settings = command_settings(ctx, config)
    checkpoint = settings.model.checkpoint
    spec = (
        load_spec(checkpoint) if (checkpoint / "meta.json").exists() else configured_spec(settings)
    )
    sharding_plan = plan_sharding(
        spec,
        nproc,
        device.value,
        settings.model.sharding.to_config(),
        batch_rows=settings.batching.max_batch_rows,
    )
    report = describe_plan(sharding_plan, spec, nproc)
    sys.stdout.write((json.dumps(report.as_dict()) if as_json else report.render()) + "\n")
