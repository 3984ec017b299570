"""The model: ``init-model`` trains and saves one, ``plan`` prints its sharding plan, and
``model list|promote|import`` manage a versions directory (:mod:`model.store.versions`)."""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.checks import require_configured_model, require_free_checkpoint_path
from pipeline.cli.common import (
    ConfigOption,
    JsonOption,
    apply_threads,
    command_settings,
    configured_spec,
    say,
)
from pipeline.cli.errors import UserError

if TYPE_CHECKING:
    from model.distributed.cost import Tables
    from model.store.versions import ModelVersions
    from pipeline.settings.loading import Settings

model_app = typer.Typer(
    help="Model versions: list them, promote one (the pipeline serves the current version).",
    no_args_is_help=True,
)

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir", help="The versions directory (default model.checkpoint).", show_default=False
    ),
]


class PlanDevice(enum.StrEnum):
    """``plan --device``: the device type of the ranks planned for."""

    CPU = "cpu"
    CUDA = "cuda"


def init_model(
    ctx: typer.Context,
    events: Annotated[int, typer.Option(help="Synthetic training events.")] = 20_000,
    epochs: Annotated[int, typer.Option(help="Passes over them.")] = 1,
    out: Annotated[
        Path | None,
        typer.Option(help="Checkpoint or versions dir (default model.checkpoint)."),
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Training seed (weights, shuffling and the held-out split).")
    ] = 0,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Replace an existing checkpoint (or version of that name)."
        ),
    ] = False,
    version: Annotated[
        str | None,
        typer.Option(help="Name of the model version (default dlrm-<date>-<weights hash>)."),
    ] = None,
    versioned: Annotated[
        bool,
        typer.Option("--versioned", help="Make a new --out a versions directory (see `model`)."),
    ] = False,
    promote: Annotated[
        bool,
        typer.Option("--promote", help="Make the new version current (implies --versioned)."),
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Train the configured DLRM briefly on synthetic interactions and save a checkpoint.

    Into a versions directory (one made by --versioned, or any directory holding
    current.json) it writes a new version; the first one becomes current, later ones with
    --promote. Otherwise it writes a plain checkpoint directory, as before.
    """
    settings = command_settings(ctx, config)
    if settings.model.module is not None:
        raise UserError(
            "init-model trains the built-in DLRM; with [model.module] bring your model's "
            "weights: `streamrank model import STATE_DICT_FILE --promote`"
        )
    path = out or settings.model.checkpoint
    as_version = _check_init_target(path, versioned or promote, overwrite, version)
    from model.store.checkpoint import save_checkpoint  # torch: once the target is checked
    from model.synthetic.train import train_ranker
    from pipeline.tools.synthetic_io import build_world

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
    metrics = {"auc": result.auc, "train_loss": result.train_loss}
    trained = f"held-out AUC {result.auc:.4f} after {result.seconds:.1f}s on {result.rows} rows"
    if not as_version:
        meta = save_checkpoint(
            result.ranker, spec, path, model_version=version, metrics=metrics, overwrite=overwrite
        )
        say(f"{trained}; saved {meta.model_version} to {path}")
        return
    versions = _open_or_create(path)
    first = versions.current() is None
    try:
        meta = versions.write(
            result.ranker, spec, version, metrics, overwrite=overwrite, promote=promote or first
        )
    except FileExistsError as error:
        raise UserError(f"{error} in {path}: pass --version NAME (or --overwrite)") from error
    say(f"{trained}; saved version {meta.model_version} to {path} (current: {versions.current()})")


def _check_init_target(
    path: Path, want_versions: bool, overwrite: bool, version: str | None
) -> bool:
    """Before training: whether ``init-model`` writes a version (else a plain checkpoint);
    raises :class:`UserError` for what would fail after training."""
    from model.store.versions import is_versions_dir, validate_version_name

    if version is not None:
        try:
            validate_version_name(version)
        except ValueError as error:
            raise UserError(f"--version: {error}") from error
    if is_versions_dir(path):
        versions = _open_versions(path)
        if version is not None and versions.path(version).exists():
            if not overwrite:
                raise UserError(
                    f"model version {version} already exists in {path}: choose another "
                    "--version, or pass --overwrite"
                )
            if versions.current() == version:
                raise UserError(f"model version {version} is current in {path}: not overwritten")
        return True
    if not want_versions:
        require_free_checkpoint_path(path, overwrite)
        return False
    if (path / "meta.json").exists():
        raise UserError(
            f"{path} holds a plain checkpoint, not model versions: pass --out NEWDIR, or "
            f"`streamrank model import {path} --dir NEWDIR` to start versions from it"
        )
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise UserError(f"{path} exists and is not an empty directory: pass --out NEWDIR")
    return True  # created after training, so a failed run leaves nothing behind


def _open_or_create(path: Path) -> ModelVersions:
    from model.store.versions import ModelVersions, is_versions_dir

    return ModelVersions(path) if is_versions_dir(path) else ModelVersions.create(path)


def _open_versions(path: Path) -> ModelVersions:
    """The versions directory at ``path``, or a :class:`UserError` saying what is there."""
    from model.store.versions import ModelVersions, is_versions_dir

    if not is_versions_dir(path):
        if (path / "meta.json").exists():
            what = "it holds a plain checkpoint"
        elif path.exists():
            what = "no current.json in it"
        else:
            what = "it does not exist"
        raise UserError(
            f"{path} is not a model versions directory ({what}): create one with "
            "`streamrank init-model --versioned --out DIR` or "
            "`streamrank model import CHECKPOINT --dir DIR`"
        )
    versions = ModelVersions(path)
    try:
        versions.pointer()
    except ValueError as error:
        raise UserError(str(error)) from error
    return versions


def _versions_dir(ctx: typer.Context, config: Path | None, directory: Path | None) -> Path:
    return directory or command_settings(ctx, config).model.checkpoint


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

    Plans the checkpoint's model when model.checkpoint holds one (the current version of a
    versions directory), else the model the [model] section describes (the one init-model
    would train).
    """
    settings = command_settings(ctx, config)
    from model.distributed import describe_plan, plan_sharding
    from model.serving.options import check_module_sharding

    if settings.model.module is not None and nproc > 1:
        try:
            check_module_sharding(settings.model.module.config, settings.model.sharding.config)
        except ValueError as error:
            raise UserError(str(error)) from error
    tables = _planned_tables(settings)
    sharding_plan = plan_sharding(
        tables,
        nproc,
        device.value,
        settings.model.sharding.config,
        max_batch_rows=settings.batching.max_batch_rows,
    )
    report = describe_plan(sharding_plan, tables, nproc)
    sys.stdout.write((json.dumps(report.as_dict()) if as_json else report.render()) + "\n")


def _planned_tables(settings: Settings) -> Tables:
    """The tables ``plan`` places: [model.module]'s own (read off the module), else the
    checkpoint's spec, else the spec the [model] section describes."""
    from model.store.checkpoint import load_spec
    from model.store.versions import NoCurrentVersionError, resolve_checkpoint

    if settings.model.module is not None:
        require_configured_model(settings)
        from model.module.checks import module_tables
        from model.module.factory import build_module
        from pipeline.models.preflight import configured_module

        config, fmap = configured_module(settings)
        layout = fmap.layout
        module = build_module(config, "meta", embedding_device="meta")
        return module_tables(module, dict(zip(layout.keys, layout.ids_per_key, strict=True)))
    try:
        return load_spec(resolve_checkpoint(settings.model.checkpoint))
    except (FileNotFoundError, NoCurrentVersionError):  # no model (or no current version) yet
        return configured_spec(settings)


@model_app.command("list")
def list_versions(
    ctx: typer.Context,
    directory: DirOption = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """The versions (oldest first), the current one marked with *; --json: one object."""
    path = _versions_dir(ctx, config, directory)
    versions = _open_versions(path)
    pointer = versions.pointer()
    infos = versions.list_versions()
    if as_json:
        report = {
            "dir": str(path),
            "current": pointer.version,
            "generation": pointer.generation,
            "promoted_at": pointer.promoted_at,
            "previous": pointer.previous,
            "versions": [info.as_dict() for info in infos],
        }
        sys.stdout.write(json.dumps(report) + "\n")
        return
    for info in infos:
        mark = "*" if info.current else " "
        metrics = " ".join(f"{k}={v:.4f}" for k, v in sorted(info.metrics.items()))
        state = info.weights_format if info.complete else "incomplete"
        sys.stdout.write(
            f"{mark} {info.version}  {info.created_at}  {state}  {metrics}".rstrip() + "\n"
        )
    if pointer.version is None:
        say(f"no current version in {path}: `streamrank model promote VERSION`")


@model_app.command("promote")
def promote_version(
    ctx: typer.Context,
    version: Annotated[str, typer.Argument(help="The version to serve (see `model list`).")],
    directory: DirOption = None,
    config: ConfigOption = None,
) -> None:
    """Make VERSION current: a running pipeline loads it and swaps it in between two batches."""
    from model.store.versions import UnknownVersionError

    path = _versions_dir(ctx, config, directory)
    versions = _open_versions(path)
    try:
        pointer = versions.promote(version)
    except (UnknownVersionError, ValueError) as error:
        raise UserError(str(error)) from error
    was = f", was {pointer.previous}" if pointer.previous else ""
    say(f"{version} is current in {path} (generation {pointer.generation}{was})")


@model_app.command("import")
def import_version(
    ctx: typer.Context,
    source: Annotated[
        Path,
        typer.Argument(
            help="A checkpoint directory (plain or sharded), or with [model.module] a "
            "state_dict file (torch.save(model.state_dict(), FILE))."
        ),
    ],
    directory: DirOption = None,
    version: Annotated[
        str | None, typer.Option(help="Name of the version (default its model_version).")
    ] = None,
    promote: Annotated[bool, typer.Option("--promote", help="Make it current.")] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace a version of that name (not the current).")
    ] = False,
    config: ConfigOption = None,
) -> None:
    """Copy a checkpoint trained elsewhere into the versions directory as a new version.

    With [model.module], SOURCE is the module's state_dict file: its keys (after
    model.module.state_dict_prefix is stripped) and shapes are checked against the configured
    module, and the version records the architecture it was imported for.
    """
    settings = command_settings(ctx, config)
    path = directory or settings.model.checkpoint
    if settings.model.module is not None:
        _import_state_dict(settings, source, path, version, promote, overwrite)
        return
    versions = _open_or_create(path) if not path.exists() else _open_versions(path)
    try:
        name = versions.add(source, version, overwrite=overwrite, promote=promote)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        raise UserError(str(error)) from error
    say(f"imported {source} as version {name} into {path} (current: {versions.current()})")


def _import_state_dict(
    settings: Settings,
    source: Path,
    path: Path,
    version: str | None,
    promote: bool,
    overwrite: bool,
) -> None:
    """``model import`` of a configured module's state_dict file (checked, then versioned)."""
    from model.store.versions import validate_version_name

    if version is not None:
        try:
            validate_version_name(version)
        except ValueError as error:
            raise UserError(f"--version: {error}") from error
    if source.is_dir():
        raise UserError(
            f"{source} is a directory: with [model.module], import the module's state_dict "
            "file (torch.save(model.state_dict(), FILE))"
        )
    require_configured_model(settings)  # factory, schema, features, dense width: one line
    from model.module.store import import_state_dict
    from pipeline.models.preflight import configured_module

    module_settings = settings.model.module
    assert module_settings is not None
    config, _ = configured_module(settings)
    versions = _open_or_create(path) if not path.exists() else _open_versions(path)
    try:
        meta = import_state_dict(
            config,
            source,
            versions,
            version,
            strip_prefix=module_settings.state_dict_prefix,
            overwrite=overwrite,
            promote=promote or versions.current() is None,
        )
    except (FileExistsError, ValueError) as error:  # ModelConfigError: keys, shapes, file
        raise UserError(str(error)) from error
    say(
        f"imported {source} as version {meta.model_version} into {path} "
        f"(current: {versions.current()})"
    )
