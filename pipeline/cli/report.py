"""``streamrank report``: PNG plots of a run, drawn from the Prometheus that scraped it."""

from __future__ import annotations

import urllib.error
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import ConfigOption, command_settings, say
from pipeline.cli.errors import UserError


def report(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option("--out", help="Directory for the PNG files.")],
    prometheus: Annotated[
        str, typer.Option(help="Base URL of the Prometheus that scraped the run.")
    ] = "http://127.0.0.1:9090",
    since: Annotated[str, typer.Option(help="How far back to plot, e.g. 90s, 30m, 2h.")] = "1h",
    rate_window: Annotated[
        str,
        typer.Option(
            help="Window of the rate() and histogram_quantile() queries, e.g. 30s or 1m: at "
            "least two scrape intervals."
        ),
    ] = "1m",
    config: ConfigOption = None,
) -> None:
    """Throughput, p50/p99 latency, DLQ by reason and batch size over time, as PNG files.

    Reads no setting, but a --config (or $STREAMRANK_CONFIG) that is missing or invalid is an
    error here too, as for every command.
    """
    from pipeline.tools.report import parse_duration, write_report

    command_settings(ctx, config)
    try:
        parse_duration(rate_window)
    except ValueError as exc:
        raise UserError(f"--rate-window: {exc}") from exc
    try:
        since_s = parse_duration(since)
    except ValueError as exc:
        raise UserError(f"--since: {exc}") from exc
    try:
        paths = write_report(out, prometheus, since_s=since_s, rate_window=rate_window)
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(f"cannot reach Prometheus at {prometheus}: {reason}") from exc
    except RuntimeError as exc:  # Prometheus answered with an error
        raise UserError(str(exc)) from exc
    for path in paths:
        say(f"wrote {path}")
