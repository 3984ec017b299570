"""``streamrank`` command line: run the pipeline, and the tools around it.

The commands live by area in :mod:`~pipeline.cli.run`, :mod:`~pipeline.cli.data`,
:mod:`~pipeline.cli.model` (also ``model list|promote|import``), :mod:`~pipeline.cli.report`
and :mod:`~pipeline.cli.bench`; this
module holds the app, the global options and the one place where user errors become one line on
stderr and exit code 2.
"""

from __future__ import annotations

import enum
import gc
import importlib.metadata
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli import (
    bench,
    capacity,
    data,
    model,
    report,
    run,
)
from pipeline.cli.common import CliState
from pipeline.cli.errors import as_user_error, one_line
from pipeline.cli.logs import LOG_FORMAT_ENV, LogFormat, active_format, configure_logging
from pipeline.cli.openmp import openmp_defaults

# How torch's OpenMP threads wait, before any command imports torch (libgomp reads it once).
openmp_defaults()


class StreamrankApp(typer.Typer):
    """The typer app; a user error ends the program with one line on stderr and exit code 2.

    Anything else keeps its traceback (exit code 1): it is a bug or an outage, not a usage
    mistake. With ``text`` or ``json`` logs the traceback is one log record, like the others.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as error:
            user_error = as_user_error(error)
            if user_error is not None:
                sys.stderr.write(f"streamrank: error: {one_line(str(user_error))}\n")
                sys.stderr.flush()
                sys.exit(user_error.exit_code)
            if active_format() in (LogFormat.TEXT, LogFormat.JSON):
                # Logs collected from a file or a pipe: the traceback is one record too.
                logging.getLogger("streamrank").critical("failed: %r", error, exc_info=error)
                sys.exit(1)
            raise  # on a terminal: typer's rich traceback
        finally:
            # The process ends now. Its last full garbage collection, over the heap that torch
            # and numba built, took 1-2 s of every exit (2 s of a SIGTERM's shutdown budget);
            # frozen objects are skipped by it. Objects are still released as their references
            # go (clients, files); only reference cycles are left to the operating system.
            gc.freeze()


class LogLevel(enum.StrEnum):
    """Levels of the ``pipeline``, ``model`` and ``streamrank`` loggers."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


GlobalConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="TOML config file (also accepted after the command).",
        show_default=False,
    ),
]

app = StreamrankApp(
    help="Real-time recommendation scoring: Kafka -> Redis features -> TorchRec DLRM -> Kafka.",
    no_args_is_help=True,
    add_completion=False,
    # A traceback never prints local variables: one may hold a Redis URL with its password or
    # a SASL password (typer before 0.23 showed them by default).
    pretty_exceptions_show_locals=False,
)


def _print_version(requested: bool) -> None:
    if requested:
        sys.stdout.write(f"streamrank {importlib.metadata.version('streamrank')}\n")
        raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    config: GlobalConfigOption = None,
    log_level: Annotated[
        LogLevel, typer.Option(help="Level of streamrank's own logs.", case_sensitive=False)
    ] = LogLevel.INFO,
    log_format: Annotated[
        LogFormat,
        typer.Option(
            help="Logs on stderr: rich (terminal), text (one record per line), json (one JSON "
            "object per line); auto: rich on a terminal, else text.",
            case_sensitive=False,
            envvar=LOG_FORMAT_ENV,
        ),
    ] = LogFormat.AUTO,
    version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
        ),
    ] = False,
) -> None:
    # User errors never reach the log: StreamrankApp prints them as one line.
    chosen = configure_logging(log_level.value, log_format)
    ctx.obj = CliState(config_file=config, log_format=chosen)


app.command()(run.run)
app.command()(data.produce)
app.command()(data.consume)
app.command("seed-features")(data.seed_features)
app.command("init-model")(model.init_model)
app.command()(model.plan)
app.command("plan-capacity")(capacity.plan_capacity)
app.command()(report.report)
app.add_typer(model.model_app, name="model")
app.add_typer(bench.bench_app, name="bench")
