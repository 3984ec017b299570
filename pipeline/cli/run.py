"""``streamrank run``: the scoring pipeline, in one process or sharded over ranks."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipeline.cli.checks import require_checkpoint, require_kafka, require_redis
from pipeline.cli.common import ConfigOption, apply_threads, command_settings, err
from pipeline.cli.errors import UserError
from pipeline.config import Settings

if TYPE_CHECKING:
    from pipeline.summary import RunSummary

log = logging.getLogger("streamrank")

STOP_MARGIN_S = 5.0
"""After SIGTERM/SIGINT, the launcher kills ranks still running ``shutdown.timeout_s`` plus this
(their own waits end within ``shutdown.timeout_s``; this covers leaving the process group)."""


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
    from pipeline.distributed import in_torchrun, run_rank, summary_path
    from pipeline.launch import Launch, supervise

    settings = command_settings(ctx, config)
    require_checkpoint(settings.model.checkpoint)
    require_kafka(settings.kafka)
    require_redis(settings.redis)
    apply_threads(settings)
    if "LOCAL_RANK" not in os.environ:  # the launcher, not a rank torchrun started
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
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        if launch.distributed:
            raise typer.Exit(supervise(launch, drop_option(sys.argv[1:], "--nproc")))
    rank_steps: dict[str, float] = {}
    if in_torchrun():
        summary, rank_steps = run_rank(settings, exit_when_idle, max_events)
    else:
        summary = _run_single(settings, exit_when_idle, max_events)
    result = {**summary.as_dict(), **({"rank_steps": rank_steps} if rank_steps else {})}
    out = summary_path(summary_json)
    if out is not None:
        out.write_text(json.dumps(result, indent=2))
    err.print(json.dumps(result))
    if in_torchrun():
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


def _run_single(
    settings: Settings, exit_when_idle: float | None, max_events: int | None
) -> RunSummary:
    from pipeline.loop import ScoringPipeline
    from pipeline.metrics import Metrics
    from pipeline.stages.score import Scorer

    metrics = Metrics()
    if settings.metrics.enabled:
        metrics.serve(settings.metrics.host, settings.metrics.port)
    scorer = Scorer.from_settings(settings.model, settings.batching.max_batch_rows)
    metrics.embedding_bytes.set(scorer.embedding_bytes())
    pipeline = ScoringPipeline(settings, scorer, metrics)
    pipeline.stop_on_signals()
    log.info(
        "scoring %s -> %s (dlq %s) with model %s",
        settings.topics.input,
        settings.topics.output,
        settings.topics.dlq,
        scorer.model_version,
    )
    return pipeline.run(exit_when_idle_s=exit_when_idle, max_events=max_events)
