"""What the command modules share: progress lines, the ``--config`` option, settings, results.

Progress and summaries go to stderr as log records of the ``streamrank`` logger (one line each,
in the ``--log-format`` of the run); stdout carries only data (JSON lines, plans, ``--json``).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from pipeline.cli.errors import UserError
from pipeline.cli.logs import LogFormat
from pipeline.observability.summary import json_line
from pipeline.settings.loading import Settings, load_settings

if TYPE_CHECKING:
    from model.features.spec import FeatureSpec

log = logging.getLogger("streamrank")

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
    log_format: LogFormat = LogFormat.TEXT
    """The resolved ``--log-format``: ``rich`` (a terminal), ``text`` or ``json``."""


def say(message: str) -> None:
    """One line of progress or result for the user: an INFO record of ``streamrank``.

    Args:
        message: what to tell (a plain sentence; no markup).

    Example::

        say("seeded 300 users and 1500 items")
    """
    log.info("%s", message)


def progress_console(ctx: typer.Context) -> Console | None:
    """The console to draw progress bars on: stderr when the logs are ``rich`` (a terminal),
    else ``None`` (no bar: bars are not log records)."""
    state = ctx.find_object(CliState)
    if state is None or state.log_format is not LogFormat.RICH:
        return None
    return Console(stderr=True)


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
    if settings.model.num_threads > 0:
        import torch  # only then: a command that stops earlier never imports it

        torch.set_num_threads(settings.model.num_threads)


def flat_items(result: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """``result``'s leaves as ``(dotted.key, value)``, nested dicts walked in order.

    Example::

        flat_items({"a": {"b": 1}, "c": [2, 3]})  # [("a.b", 1), ("c", [2, 3])]
    """
    items: list[tuple[str, Any]] = []
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            items.extend(flat_items(value, f"{name}."))
        else:
            items.append((name, value))
    return items


def emit(result: dict[str, Any], as_json: bool) -> None:
    """A benchmark result: one strict JSON line on stdout (``--json``), or one
    ``dotted.key: value`` line per leaf on stdout (values as JSON).

    Args:
        result: the benchmark's numbers.
        as_json: whether ``--json`` was given.
    """
    if as_json:
        sys.stdout.write(json_line(result) + "\n")
    else:
        for key, value in flat_items(result):
            sys.stdout.write(f"{key}: {json_line(value)}\n")
    sys.stdout.flush()
