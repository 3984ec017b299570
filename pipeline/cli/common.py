"""What the command modules share: the stderr console, the ``--config`` option, settings."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from pipeline.cli.errors import UserError
from pipeline.config import Settings, load_settings

if TYPE_CHECKING:
    from model.spec import FeatureSpec

err = Console(stderr=True)
"""Progress, summaries and logs go to stderr; stdout carries only data (JSON lines, plans)."""

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML config file (also accepted before the command; this one wins).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Last line: a JSON object.")]


@dataclass(frozen=True)
class CliState:
    """What the global options (before the command) leave for the command: ``ctx.obj``."""

    config_file: Path | None = None


def command_settings(ctx: typer.Context, config: Path | None) -> Settings:
    """The settings of this command: ``--config`` after the command, else the one before it.

    Args:
        ctx: the command's context (its parent holds :class:`CliState`).
        config: the command's own ``--config`` value.

    Returns:
        The validated :class:`Settings` (file, ``STREAMRANK_*`` environment, defaults).

    Example::

        settings = command_settings(ctx, config)
    """
    state = ctx.find_object(CliState)
    chosen = config if config is not None else (state.config_file if state else None)
    return load_settings(chosen)


def configured_spec(settings: Settings) -> FeatureSpec:
    """The feature spec the ``[model]`` section describes; an inconsistent one is a user error.

    Args:
        settings: the command's settings.

    Returns:
        ``settings.model.feature_spec()``.
    """
    try:
        return settings.model.feature_spec()
    except ValueError as error:
        raise UserError(f"bad config value in [model]: {error}") from error


def with_checkpoint(settings: Settings, checkpoint: Path) -> Settings:
    """``settings`` with ``model.checkpoint`` set to ``checkpoint`` (a resolved version).

    Args:
        settings: the command's settings.
        checkpoint: the checkpoint directory to use instead.

    Returns:
        A copy; ``settings`` is unchanged.

    Example::

        settings = with_checkpoint(settings, require_checkpoint(settings.model.checkpoint))
    """
    model = settings.model.model_copy(update={"checkpoint": checkpoint})
    return settings.model_copy(update={"model": model})


def apply_threads(settings: Settings) -> None:
    """Set torch's intra-op threads when ``model.num_threads`` asks for a number."""
    import torch

    if settings.model.num_threads > 0:
        torch.set_num_threads(settings.model.num_threads)


def emit(result: dict[str, Any], as_json: bool) -> None:
    """A benchmark result: one JSON line on stdout, or ``key: value`` lines on stderr."""
    if as_json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        for key, value in result.items():
            err.print(f"{key}: {value}")
