"""``streamrank run``: the scoring pipeline, in one process or sharded over ranks."""

from __future__ import annotations

import dataclasses
import faulthandler
import functools
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from model.rank import RankContext
from model.serving.options import check_module_sharding
from pipeline.cli.checks import (
    require_builtin_model,
    require_checkpoint,
    require_configured_model,
    require_device,
    require_kafka,
    require_module_version,
    require_redis,
    require_schema_registry,
)
from pipeline.cli.common import CliState, ConfigOption, apply_threads, command_settings
from pipeline.cli.errors import UserError
from pipeline.cli.logs import LogFormat, configure_logging
from pipeline.jobs.launch import STACKS_SIGNAL, Launch
from pipeline.jobs.summaries import RANK_SUMMARIES_ENV, merge_rank_summaries, write_rank_summary
from pipeline.models.loader import serving_options
from pipeline.observability.summary import RunSummary, json_line
from pipeline.settings.loading import Settings

if TYPE_CHECKING:
    from pipeline.models.output import OutputContract
    from pipeline.models.preflight import ConfiguredModel

log = logging.getLogger("streamrank")

SERVED_CHECKPOINT_ENV = "STREAMRANK_SERVED_CHECKPOINT"
"""Set by the launcher for the ranks it starts: the checkpoint directory all of them serve
(a versions directory's current version, resolved once), so that a promotion during start-up
cannot give the ranks of one job different versions."""

STOP_MARGIN_S = 5.0
"""After SIGTERM/SIGINT, the launcher kills ranks still running ``shutdown.timeout_s`` plus this
(their own waits end within ``shutdown.timeout_s``; this covers leaving the process group)."""


def run(
    ctx: typer.Context,
    exit_when_idle: Annotated[
        float | None,
        typer.Option(
            help="Stop cleanly after this many seconds without input "
            "(counted once the group has assigned partitions; with several ranks, all idle). "
            "After a kill -9, the dead members keep their partitions until their session "
            "times out (kafka.session_timeout_ms): wait longer than that then."
        ),
    ] = None,
    max_events: Annotated[int | None, typer.Option(help="Stop after consuming this many.")] = None,
    summary_json: Annotated[
        Path | None,
        typer.Option(
            help="Also write the run summary to this JSON file (with --nproc: the job's, "
            'merged over the ranks, each rank\'s figures under "ranks").'
        ),
    ] = None,
    nproc: Annotated[
        int, typer.Option(help="Ranks: >1 shards the model across ranks through torchrun.")
    ] = 1,
    max_restarts: Annotated[
        int, typer.Option(help="With --nproc > 1: times torchrun restarts the ranks.")
    ] = 3,
    min_nproc: Annotated[
        int | None,
        typer.Option(
            help="When the ranks keep failing (more than --max-restarts), start again with one "
            "rank fewer, down to this many (one node only). Default: --nproc (never degrade)."
        ),
    ] = None,
    nnodes: Annotated[
        int, typer.Option(help="Hosts in the job; run this command on each (torchrun --nnodes).")
    ] = 1,
    node_rank: Annotated[int, typer.Option(help="With --nnodes > 1: this host's index.")] = 0,
    rdzv_endpoint: Annotated[
        str | None,
        typer.Option(help="With --nnodes > 1: HOST:PORT of node 0, where the nodes meet."),
    ] = None,
    config: ConfigOption = None,
) -> None:
    """Consume UserEvents, score them, produce Recommendations (until stopped).

    The run summary is the last line on stderr: one line of strict JSON. With --nproc N it is
    the job's, merged from every rank (counts summed, latency percentiles over all ranks'
    events; each rank's own figures under "ranks"), and --summary-json writes that one file.
    """
    settings = command_settings(ctx, config)
    rank = RankContext.from_env()
    # The launcher (not a rank torchrun started) checks the launch options first, and the
    # model options against the job's size; the ranks run without --nproc.
    launch = (
        _launch(settings, nproc, max_restarts, min_nproc, nnodes, node_rank, rdzv_endpoint)
        if "LOCAL_RANK" not in os.environ
        else None
    )
    require_device(settings.model.device)
    configured: ConfiguredModel | None = None
    output: OutputContract | None = None  # the built-in model's (a configured one carries its)
    if launch is not None:  # once, before any rank starts (the ranks run the checks' result)
        if settings.model.module is None:
            output = require_builtin_model(settings)
        else:
            configured = require_configured_model(settings)
    pinned = os.environ.get(SERVED_CHECKPOINT_ENV) if "LOCAL_RANK" in os.environ else None
    served = require_checkpoint(Path(pinned) if pinned else settings.model.checkpoint)
    if launch is not None and configured is not None:  # checked once: the loader takes it
        checked = require_module_version(settings, served, configured)
        configured = dataclasses.replace(configured, checked=checked)
    require_kafka(settings.kafka)
    require_redis(settings.redis)
    require_schema_registry(settings.codec)
    if launch is not None and launch.distributed:
        os.environ[SERVED_CHECKPOINT_ENV] = str(served)  # every rank serves the same version
        raise typer.Exit(_launch_ranks(launch, summary_json))
    apply_threads(settings)
    if rank.distributed:  # a rank the launcher must kill writes where it hung first
        faulthandler.register(STACKS_SIGNAL, all_threads=True)
    # The serving path (torch, TorchRec) is imported once every check has passed: a user
    # error is one line at once, and the launcher of --nproc N never imports it.
    from model.module.types import ModelConfigError
    from model.serving import UnsupportedOption
    from pipeline.jobs.launch import DEGRADATIONS_ENV
    from pipeline.jobs.summaries import summary_path
    from pipeline.models.mapping import FeatureMapError
    from pipeline.models.output import OutputContractError
    from pipeline.serve import serve

    if served != settings.model.checkpoint:
        log.info("serving model version %s of %s", served.name, settings.model.checkpoint)
    try:
        summary, rank_steps = serve(
            settings,
            rank,
            exit_when_idle,
            max_events,
            degradations=int(os.environ.get(DEGRADATIONS_ENV, "0")),
            checkpoint=served,
            worker_setup=_worker_logging(ctx),
            configured=configured,
            output=output,
        )
    except (UnsupportedOption, ModelConfigError, FeatureMapError, OutputContractError) as exc:
        raise UserError(str(exc)) from exc
    if rank.distributed:
        _finish_rank(summary, rank, rank_steps, summary_path(summary_json, rank))
    result = summary.as_dict()
    if summary_json is not None:
        summary_json.write_text(json_line(result) + "\n")
    _print_summary(result)


def _launch(
    settings: Settings,
    nproc: int,
    max_restarts: int,
    min_nproc: int | None,
    nnodes: int,
    node_rank: int,
    rdzv_endpoint: str | None,
) -> Launch:
    """The launch options, and the model options checked against the job's size (an option
    several ranks cannot serve is refused before any rank starts)."""
    try:
        launch = Launch(
            nproc,
            max_restarts,
            min_nproc,
            nnodes,
            node_rank,
            rdzv_endpoint,
            stop_timeout_s=settings.shutdown.timeout_s + STOP_MARGIN_S,
        )
        world = launch.nproc * launch.nnodes
        if world > 1:  # one process serves any options; several ranks refuse some
            options = serving_options(settings)
            options.check(world)
            if settings.model.module is not None:
                check_module_sharding(settings.model.module.config, options.sharding)
    except ValueError as exc:  # UnsupportedOption included
        raise UserError(str(exc)) from exc
    return launch


def _worker_logging(ctx: typer.Context) -> Callable[[], object]:
    """The logging of this command, to be set up again in each ingest worker (picklable)."""
    state = ctx.find_object(CliState)
    level = logging.getLevelName(logging.getLogger("pipeline").getEffectiveLevel())
    chosen = state.log_format if state else LogFormat.TEXT
    return functools.partial(configure_logging, level, chosen)


def _print_summary(result: dict[str, object]) -> None:
    """The run summary as the last line on stderr: strict JSON (``null``, never ``NaN``).

    Logging ends here: what the interpreter's teardown might log would follow the summary.
    """
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.write(json_line(result) + "\n")
    sys.stderr.flush()
    logging.disable(logging.CRITICAL)


def _launch_ranks(launch: Launch, summary_json: Path | None) -> int:
    """Run the ranks under torchrun (:func:`~pipeline.jobs.launch.supervise`), then print (and with
    ``--summary-json``, write) the job's summary merged from the ranks' records.

    Returns:
        torchrun's exit status.
    """
    from pipeline.jobs.launch import supervise

    rank_args = drop_option(drop_option(sys.argv[1:], "--nproc"), "--summary-json")
    if launch.nproc > 1:
        # torchrun's own default, set here so that torchrun does not print a banner about it
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="streamrank-ranks-") as records:
        os.environ[RANK_SUMMARIES_ENV] = records
        try:
            rc = supervise(launch, rank_args)
        finally:
            del os.environ[RANK_SUMMARIES_ENV]
        merged = merge_rank_summaries(Path(records))
    if merged is None:
        log.error("no rank wrote a summary (exit status %d)", rc)
        return rc
    if summary_json is not None:
        summary_json.write_text(json_line(merged) + "\n")
    _print_summary(merged)
    return rc


def _finish_rank(
    summary: RunSummary, rank: RankContext, rank_steps: dict[str, float], own_file: Path | None
) -> None:
    """A rank's end: its record for the launcher (or, under a plain torchrun, its own
    ``--summary-json`` file), one log line, and an exit that skips interpreter teardown."""
    result = {**summary.as_dict(), "rank_steps": rank_steps}
    records = os.environ.get(RANK_SUMMARIES_ENV)
    if records:
        write_rank_summary(Path(records), summary, rank, rank_steps)
    elif own_file is not None:
        own_file.write_text(json_line(result) + "\n")
    log.info("rank summary: %s", json_line(result))
    # gloo ranks occasionally abort in interpreter teardown after a clean run
    # (pytorch/pytorch#190489); the work is done and committed, so leave without it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def drop_option(args: list[str], name: str) -> list[str]:
    """Remove ``name VALUE`` / ``name=VALUE`` from a command line.

    Args:
        args: the command line, without the program name.
        name: the option, e.g. ``--nproc``.

    Returns:
        ``args`` without that option and its value.

    Example::

        drop_option(["run", "--nproc", "2", "-c", "f"], "--nproc")  # ["run", "-c", "f"]
    """
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
