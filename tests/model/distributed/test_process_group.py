"""Tests for model.distributed.process_group: one join for torchrun and spawned ranks."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from model.distributed import join_process_group
from tests.model.distributed.ranks import finish_rank, spawn_ranks


def _attempt_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="3"
    )
    device = join_process_group(rank, world_size, backend="gloo", timeout_s=60)
    assert device == torch.device("cpu") and dist.get_world_size() == world_size
    assert join_process_group(rank, world_size) == device  # a second call keeps the group
    if rank == 0:
        # Keys of this restart attempt live under its own prefix of the rank-0 store.
        dist.distributed_c10d._get_default_store().set("probe", "x")
        raw = dist.TCPStore("127.0.0.1", port, world_size, False, timedelta(seconds=30))
        Path(out_dir, "key").write_text(raw.get("streamrank/attempt-3/probe").decode())
    finish_rank()


def test_join_uses_a_store_prefix_per_restart_attempt(tmp_path: Path) -> None:
    spawn_ranks(_attempt_worker, 2, str(tmp_path))
    assert (tmp_path / "key").read_text() == "x"
