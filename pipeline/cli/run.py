"""``streamrank run``: the scoring pipeline, in one process or sharded over ranks."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.checks import require_checkpoint, require_kafka, require_redis
from pipeline.cli.common import ConfigOption, apply_threads, command_settings, err
from pipeline.cli.errors import UserError

log = logging.getLogger("streamrank")

SERVED_CHECKPOINT_ENV = "STREAMRANK_SERVED_CHECKPOINT"
"""Set by the launcher for the ranks it starts: the checkpoint directory all of them serve
(a versions directory's current version, resolved once), so that a promotion during start-up
cannot give the ranks of one job different versions."""


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
    """Consume UserEvents, score them, produce Recommendations (until stopped)."""
    from model.rank import RankContext
    from model.serving import UnsupportedOption
    from pipeline.distributed import summary_path
    from pipeline.launch import DEGRADATIONS_ENV, Launch, supervise
    from pipeline.serve import serve

    settings = command_settings(ctx, config)
    rank = RankContext.from_env()
    launch: Launch | None = None
    if "LOCAL_RANK" not in os.environ:  # the launcher, not a rank torchrun started
        try:
            launch = Launch(nproc, max_restarts, min_nproc, nnodes, node_rank, rdzv_endpoint)
            options = settings.model.serving_options(settings.batching.max_batch_rows)
            options.check(launch.nproc * launch.nnodes)
        except ValueError as exc:  # UnsupportedOption included: refused before any rank starts
            raise UserError(str(exc)) from exc
    pinned = os.environ.get(SERVED_CHECKPOINT_ENV) if "LOCAL_RANK" in os.environ else None
    served = require_checkpoint(Path(pinned) if pinned else settings.model.checkpoint)
    require_kafka(settings.kafka)
    require_redis(settings.redis)
    apply_threads(settings)
    if launch is not None and launch.distributed:
        os.environ[SERVED_CHECKPOINT_ENV] = str(served)  # every rank serves the same version
        raise typer.Exit(supervise(launch, drop_option(sys.argv[1:], "--nproc")))
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
        )
    except UnsupportedOption as exc:
        raise UserError(str(exc)) from exc
    result = {**summary.as_dict(), **({"rank_steps": rank_steps} if rank_steps else {})}
    out = summary_path(summary_json, rank)
    if out is not None:
        out.write_text(json.dumps(result, indent=2))
    err.print(json.dumps(result))
    if rank.distributed:
        # gloo ranks occasionally abort in interpreter teardown after a clean run
        # (pytorch/pytorch#190489); the work is done and committed, so leave without it.
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
