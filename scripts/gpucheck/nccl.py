"""``nccl_2_ranks``: the parity of a 2-rank NCCL ``DistributedModelParallel``, in child processes.

Each rank joins through :func:`model.distributed.join_process_group` (its GPU bound with
``device_id``) and plans with the local world size, as a served rank does. The parent polls
the result queue and the children's exit codes: a rank that crashes or reports an error ends
the section at once (its peer would otherwise wait in a collective until NCCL's timeout), and
the whole section is bounded by ``timeout_s``.
"""

from __future__ import annotations

import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from model.ranker import build_ranker
from scripts.gpucheck.common import (
    TOLERANCE,
    batch,
    check_spec,
    free_port,
    max_abs_diff,
    synthetic_world,
)
from scripts.gpucheck.model_sections import dmp_scores

WORLD_SIZE = 2


def _rank(rank: int, results: Any, port: int, rows: int, small: bool) -> None:
    """One rank (a spawned child): its scores against the CPU model, or its error."""
    try:
        from model.distributed import join_process_group

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        spec = check_spec(small)
        device = join_process_group(rank, WORLD_SIZE, local_rank=rank, backend="nccl")
        ranker = build_ranker(spec, seed=0).eval()
        inp = batch(synthetic_world(spec), spec, rows)
        got = dmp_scores(ranker, spec, inp, device)
        results.put({"rank": rank, "max_abs_diff": max_abs_diff(got, ranker.score(inp))})
        dist.destroy_process_group()
    except Exception as exc:
        results.put(
            {
                "rank": rank,
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc().splitlines()[-10:],
            }
        )
        raise


def nccl_2_ranks(rows: int, small: bool, timeout_s: float) -> dict[str, Any]:
    """The 2-rank NCCL parity: each rank's largest score difference against the CPU model.

    Args:
        rows: rows of the compared batch.
        small: the small spec.
        timeout_s: the most the section may take.

    Returns:
        ``{"ranks": [...], "ok": ...}`` (plus ``"error"`` when a rank died, failed or the time
        ran out); ``{"skipped": ...}`` with fewer than 2 GPUs.
    """
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < WORLD_SIZE:
        return {"skipped": f"needs {WORLD_SIZE} GPUs, this machine has {gpus}"}
    ranks, error = run_ranks(_rank, WORLD_SIZE, (free_port(), rows, small), timeout_s)
    ok = error is None and all(r["max_abs_diff"] <= TOLERANCE for r in ranks)
    return {"ranks": ranks, "ok": ok} | ({"error": error} if error is not None else {})


def run_ranks(
    target: Callable[..., None], world_size: int, args: tuple[Any, ...], timeout_s: float
) -> tuple[list[dict[str, Any]], str | None]:
    """Spawn ``target(rank, results, *args)`` per rank and collect one dict per rank from the
    ``results`` queue, never waiting on a dead rank.

    The queue and the children's exit codes are polled: a rank that exits without a result or
    reports ``{"error": ...}`` ends the wait at once (its peers, stuck in a collective, are
    killed), and so does ``timeout_s``.

    Args:
        target: a picklable function; it puts ``{"rank": rank, ...}`` on ``results``.
        world_size: how many ranks.
        args: the rest of ``target``'s arguments.
        timeout_s: the longest wait for all results.

    Returns:
        ``(results by rank, error or None)``.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(r, results, *args), daemon=True) for r in range(world_size)
    ]
    for p in procs:
        p.start()
    got: dict[int, dict[str, Any]] = {}
    error: str | None = None
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < world_size and error is None:
            try:
                item = results.get(timeout=0.5)
            except queue.Empty:
                error = _why_stop(procs, results, got, time.monotonic() > deadline, timeout_s)
                continue
            got[item["rank"]] = item
            if "error" in item:
                error = f"rank {item['rank']} failed: {item['error']}"
    finally:
        for p in procs:
            p.join(timeout=10 if error is None else 0.5)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
    return [got[r] for r in sorted(got)], error


def _why_stop(
    procs: list[Any], results: Any, got: dict[int, dict[str, Any]], late: bool, timeout_s: float
) -> str | None:
    """Why the wait is over, or ``None`` to keep waiting: a rank exited without a result, or
    time is up. A rank that exited is given one more second for a result still in the pipe."""
    exited = [r for r, p in enumerate(procs) if r not in got and p.exitcode is not None]
    while exited:
        try:
            item = results.get(timeout=1.0)
        except queue.Empty:
            rank = exited[0]
            return f"rank {rank} exited with code {procs[rank].exitcode} before reporting"
        got[item["rank"]] = item
        if "error" in item:
            return f"rank {item['rank']} failed: {item['error']}"
        exited = [r for r in exited if r not in got]
    if late:
        missing = sorted(set(range(len(procs))) - set(got))
        return f"no result from ranks {missing} within {timeout_s} s"
    return None
