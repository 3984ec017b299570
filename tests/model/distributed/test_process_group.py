"""Tests for model.distributed.process_group: one join for torchrun and spawned ranks."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist

from model.distributed import join_process_group
from tests.model.distributed.ranks import finish_rank, spawn_ranks


def _agent_store_worker(rank: int, world_size: int, _port: int, store_port: int) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store_port),
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT="3",
    )
    torch.set_num_threads(1)
    device = join_process_group(rank, world_size, backend="gloo", timeout_s=60)
    assert device == torch.device("cpu") and dist.get_world_size() == world_size
    assert join_process_group(rank, world_size) == device  # a second call keeps the group
    total = torch.ones(1)
    dist.all_reduce(total)
    assert total.item() == world_size
    finish_rank()


@pytest.mark.slow
def test_ranks_meet_in_the_agent_store_under_a_prefix_per_restart_attempt() -> None:
    # The test process plays torchrun's agent, which hosts the store across restarts.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    agent_store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False)
    spawn_ranks(_agent_store_worker, 2, port)
    keys = agent_store.list_keys()
    assert keys and all(k.startswith("streamrank/attempt-3/") for k in keys), keys
