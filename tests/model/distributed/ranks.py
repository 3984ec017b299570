"""Helpers for tests that spawn real ranks (start method ``spawn``, gloo on 127.0.0.1).

Each rank builds the same seeded unsharded ranker as a reference, shards it, and compares
scores of its own local batch, of the full batch and of uneven prefixes with the reference.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from model.distributed import join_process_group
from model.features.build import build_model_input
from model.features.model_input import ModelInput, pad_model_input
from model.features.spec import FeatureSpec
from model.synthetic import SyntheticWorld, feature_columns
from tests.model.conftest import SMALL_WORLD

TOLERANCE = 1e-5
EVENTS_PER_RANK = 12
ROWS_PER_RANK = 12 * 30  # EVENTS_PER_RANK * SMALL_WORLD.max_candidates: fits any local batch
SPAWN_TIMEOUT_S = 150.0

MIXED_3_RANKS = (
    "table_wise,"
    "user_id=row_wise,"
    "item_id=column_wise,"
    "item_category=data_parallel,"
    "device=table_wise:dense,"
    "country=table_row_wise,"
    "recent_items=table_wise,"
    "balance=planner"
)


def free_port() -> int:
    """A TCP port that was free a moment ago (for MASTER_PORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spawn_ranks(fn: Callable[..., None], world_size: int, *args: Any) -> None:
    """Run ``fn(rank, world_size, port, *args)`` in ``world_size`` spawned processes.

    A failure in any rank is raised here (with the rank's traceback); ranks still running
    after ``SPAWN_TIMEOUT_S`` are killed and the test fails.
    """
    ctx = mp.start_processes(
        fn,
        args=(world_size, free_port(), *args),
        nprocs=world_size,
        join=False,
        start_method="spawn",
    )
    assert ctx is not None
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
            pytest.fail(f"{world_size} ranks did not finish within {SPAWN_TIMEOUT_S:.0f} s")


def start_rank(rank: int, world_size: int, port: int) -> torch.device:
    """Per-rank setup inside a spawned worker: env, one thread, gloo process group."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    return join_process_group(rank, world_size, local_rank=rank, backend="gloo", timeout_s=120)


def finish_rank() -> None:
    """Per-rank teardown after success: barrier, destroy the group, exit without finalization.

    A gloo worker thread may still be destroying a finished collective's work (which holds
    Python-owned tensors) while the interpreter finalizes; the destructor then needs the GIL
    and the process dies with "terminate called without an active exception" (SIGABRT), seen
    here in ~1 of 20 three-rank runs that used object collectives, even after
    destroy_process_group() (pytorch/pytorch#190489). ``os._exit`` skips finalization. Only
    call it on success: a raised exception must reach torch.multiprocessing's error file.
    """
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def rank_inputs(spec: FeatureSpec, world_size: int, rank: int) -> tuple[ModelInput, ModelInput]:
    """(this rank's local batch padded to ROWS_PER_RANK rows, the full batch of all ranks)."""
    world = SyntheticWorld(SMALL_WORLD)
    events = world.sample_events(EVENTS_PER_RANK * world_size, np.random.default_rng(21))
    cols = feature_columns(events, world, spec)
    local_cols = cols.slice_events(rank * EVENTS_PER_RANK, (rank + 1) * EVENTS_PER_RANK)
    local = pad_model_input(build_model_input(local_cols, spec), ROWS_PER_RANK)
    return local, build_model_input(cols, spec)


def first_rows(inp: ModelInput, rows: int) -> ModelInput:
    """The first ``rows`` rows of ``inp`` (every key's bags of those rows)."""
    keys = inp.sparse.keys()
    lengths = inp.sparse.lengths().view(len(keys), inp.num_rows)
    offsets = inp.sparse.offset_per_key()
    starts = [int(offsets[k]) for k in range(len(keys))]
    values = [
        inp.sparse.values()[start : start + int(lengths[k, :rows].sum())]
        for k, start in enumerate(starts)
    ]
    sparse = KeyedJaggedTensor(
        keys=keys,
        values=torch.cat(values),
        lengths=lengths[:, :rows].reshape(-1).contiguous(),
        stride=rows,
    )
    return ModelInput(dense=inp.dense[:rows].contiguous(), sparse=sparse)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())
