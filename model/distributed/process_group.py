"""Joining the default process group: one way for torchrun ranks, spawned test ranks and tools."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from model.serving.device import rank_device

__all__ = ["default_backend", "join_process_group", "local_world_size"]


def default_backend() -> str:
    """``"nccl"`` when CUDA is available, else ``"gloo"``."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def local_world_size(world_size: int | None = None) -> int:
    """Ranks per host: ``$LOCAL_WORLD_SIZE`` (torchrun sets it), else the whole world (one host).

    The sharding plan needs it to place rank ``r``'s shards on ``cuda:{r % local_world_size}``,
    the GPU that rank runs on (:func:`model.serving.device.rank_device` of its ``LOCAL_RANK``).

    Args:
        world_size: the world size (default ``$WORLD_SIZE``, else 1).

    Returns:
        The number of ranks on each host.

    Example::

        plan = plan_sharding(spec, world, "cuda", local_world_size=local_world_size(world))
    """
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))


def join_process_group(
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    backend: str | None = None,
    timeout_s: float = 300.0,
) -> torch.device:
    """Initialise the default process group (unless it exists) and pick this rank's device.

    The ranks meet in a TCPStore at ``MASTER_ADDR:MASTER_PORT``, under a key prefix per
    torchrun restart attempt (``TORCHELASTIC_RESTART_COUNT``): torchrun restarts all ranks
    together when one dies, and the restarted ranks meet in the same agent-hosted store, where
    keys left by the previous attempt (the dead ranks' gloo addresses) would otherwise be read
    as current. Under torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE=True``) every rank
    is a client; otherwise rank 0 hosts the store.

    An NCCL group is bound to this rank's GPU (``device_id``): its communicator is created
    at once rather than at the first collective, and barriers use this GPU instead of guessing
    one from the rank.

    Missing arguments come from the environment torchrun sets (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``); spawned ranks (tests) pass them and set ``MASTER_ADDR``/``MASTER_PORT``.

    Args:
        rank: global rank (default ``$RANK``, else 0).
        world_size: number of ranks (default ``$WORLD_SIZE``, else 1).
        local_rank: rank on this host (default ``$LOCAL_RANK``, else ``rank``).
        backend: default :func:`default_backend` (NCCL with CUDA, else gloo).
        timeout_s: store and collective timeout.

    Returns:
        :func:`model.serving.device.rank_device` of the local rank.

    Raises:
        KeyError: if the group does not exist yet and ``MASTER_ADDR``/``MASTER_PORT`` are unset.
        model.serving.device.DeviceUnavailableError: with CUDA, if this host has no GPU
        ``local_rank``.

    Example::

        device = join_process_group()  # under torchrun
        dmp = shard_ranker(spec, plan_sharding(spec, dist.get_world_size(), device.type), device)
    """
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    device = rank_device(local_rank)
    if dist.is_initialized():
        return device
    timeout = timedelta(seconds=timeout_s)
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not agent_store and rank == 0,
        timeout=timeout,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    backend = backend or default_backend()
    bound = device if "nccl" in backend and device.type == "cuda" else None
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore(f"streamrank/attempt-{attempt}", store),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=bound,
    )
    return device
