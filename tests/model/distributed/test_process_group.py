"""Tests for model.distributed.process_group: one join for torchrun and spawned ranks."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist

from model.distributed import join_process_group, local_world_size
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


@pytest.mark.parametrize(
    ("backend", "device", "bound"),
    [
        ("nccl", torch.device("cuda", 1), True),
        ("cpu:gloo,cuda:nccl", torch.device("cuda", 1), True),
        ("gloo", torch.device("cuda", 1), False),
        ("gloo", torch.device("cpu"), False),
    ],
)
def test_an_nccl_group_is_bound_to_the_ranks_gpu(
    monkeypatch: pytest.MonkeyPatch, backend: str, device: torch.device, bound: bool
) -> None:
    # Without device_id NCCL creates its communicator lazily and barriers guess the GPU.
    import model.distributed.process_group as process_group

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(process_group, "rank_device", lambda local_rank: device)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")  # a real store on a free port, no peers
    assert join_process_group(0, 1, local_rank=1, backend=backend, timeout_s=10) == device
    assert len(calls) == 1 and calls[0]["backend"] == backend
    assert calls[0].get("device_id") == (device if bound else None)


def test_local_world_size_comes_from_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert local_world_size() == 4  # one host
    assert local_world_size(6) == 6
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert local_world_size() == 2
