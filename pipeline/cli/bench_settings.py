"""The settings of a ``streamrank bench`` command: which benchmarks take a model of the user's
(``[model.module]``), the checks before any tool is imported (each mistake one line), and the
config file handed to the child processes a benchmark starts."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from pipeline.cli.checks import (
    require_configured_model,
    require_device,
    require_kafka,
    require_redis,
    require_schema_registry,
)
from pipeline.cli.common import CliState, ConfigOption, apply_threads, command_settings
from pipeline.cli.errors import UserError
from pipeline.settings.loading import CONFIG_ENV_VAR, Settings

__all__ = [
    "CONFIGURED_BENCHES",
    "builtin_only",
    "chosen_config",
    "configured_model",
    "export_config_file",
    "model_settings",
    "stack_settings",
]


CONFIGURED_BENCHES = ("model", "pipeline", "overhead", "latency", "ingest", "soak")
"""The benchmarks that measure a model of the user's (``[model.module]``) as well."""


def builtin_only(settings: Settings, command: str) -> Settings:
    """``settings``, unless they configure a model of the user's and ``command`` measures the
    built-in model only (its synthetic world and spec).

    Raises:
        UserError: ``[model.module]`` (or ``[events]``/``[features]``) is set.
    """
    if settings.model.module is not None or settings.events.configured:
        raise UserError(
            f"bench {command} measures the built-in model only; with [model.module] run "
            f"`bench {' / '.join(CONFIGURED_BENCHES)}`, or leave [model.module] unset"
        )
    return settings


def configured_model(settings: Settings) -> Settings:
    """``settings`` once a configured model's mistakes (``[model.module]``, ``[events]``,
    ``[features]``, ``[output]``, and a version of another architecture at
    ``model.checkpoint``) are each one line; the built-in model's ``[output]`` is checked too.

    Raises:
        UserError: the first mistake.
    """
    require_configured_model(settings)
    if settings.model.module is not None:
        from pipeline.tools.bench.served import configured_version

        try:
            configured_version(settings)
        except ValueError as error:  # ModelConfigError: another architecture's version
            raise UserError(f"{error} (model.checkpoint)") from error
    return settings


def model_settings(ctx: typer.Context, config: ConfigOption, command: str) -> Settings:
    """Settings for a forward-only bench (no stack needed; a configured model's batches are
    built from records in Redis), torch threads applied."""
    settings = command_settings(ctx, config)
    if command in CONFIGURED_BENCHES:
        configured_model(settings)
        if settings.model.module is not None:
            require_redis(settings.redis)
    else:
        builtin_only(settings, command)
    require_device(settings.model.device)
    apply_threads(settings)
    return settings


def stack_settings(ctx: typer.Context, config: ConfigOption, command: str) -> Settings:
    """Settings of a benchmark on the stack, after checking the device, Kafka and Redis (and a
    configured model, for the benchmarks that take one; the others refuse one:
    :func:`builtin_only`)."""
    settings = command_settings(ctx, config)
    if command in CONFIGURED_BENCHES:
        configured_model(settings)
    else:
        builtin_only(settings, command)
    require_device(settings.model.device)
    require_kafka(settings.kafka)
    require_redis(settings.redis)
    require_schema_registry(settings.codec)
    return settings


def chosen_config(ctx: typer.Context, config: ConfigOption) -> Path | None:
    """The ``--config`` file of the command (after it, else before it), resolved."""
    state = ctx.find_object(CliState)
    chosen = config if config is not None else (state.config_file if state else None)
    return None if chosen is None else chosen.resolve()


def export_config_file(ctx: typer.Context, config: ConfigOption) -> None:
    """Hand the chosen ``--config`` file to the child processes a benchmark starts."""
    chosen = chosen_config(ctx, config)
    if chosen is not None:
        os.environ[CONFIG_ENV_VAR] = str(chosen)
