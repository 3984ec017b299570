"""Which device this process (or rank) runs the model on, and binding threads to it.

CUDA's current device is a property of the calling thread: ``torch.cuda.set_device`` on the main
thread leaves every other thread on ``cuda:0``. Any call without an explicit device (TorchRec's
and FBGEMM's ``torch.cuda.current_stream()`` / ``current_device()``, new CUDA-graph pools, NCCL
barriers) then targets GPU 0. So every thread that touches this rank's GPU binds itself first:
the main thread through :func:`rank_device`, the scoring thread through :func:`bind_thread`
(its executor's ``initializer``).
"""

from __future__ import annotations

import os
import threading

import torch

__all__ = [
    "DeviceUnavailableError",
    "bind_thread",
    "bound_device",
    "rank_device",
    "serving_device",
]

_lock = threading.Lock()
_bound: list[torch.device] = []  # the CUDA device the last bind made current (0 or 1 item)


class DeviceUnavailableError(ValueError):
    """The GPU a rank should use does not exist on this host (a launch mistake, not a bug)."""


def rank_device(local_rank: int) -> torch.device:
    """``cuda:<local_rank>`` when CUDA is available (made current on this thread), else ``cpu``.

    Each rank of a host owns one GPU: there is no wrap-around, since two ranks on one GPU
    would fail at their first NCCL collective ("Duplicate GPU detected") or, with gloo, share
    its memory unknowingly.

    Args:
        local_rank: the process's rank on its host (``LOCAL_RANK`` under torchrun; 0 for a
            single process).

    Returns:
        The device to put this rank's model and batches on.

    Raises:
        DeviceUnavailableError: CUDA is available but ``local_rank`` is not below the number
            of visible GPUs (one line: start at most that many ranks per host).

    Example::

        device = rank_device(RankContext.from_env().local_rank)
    """
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if not 0 <= local_rank < count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise DeviceUnavailableError(
            f"local rank {local_rank} needs GPU {local_rank} but this host has {count} visible "
            f"GPU(s){shown}: start at most {count} rank(s) per host"
        )
    device = torch.device("cuda", local_rank)
    bind_thread(device)
    return device


def bind_thread(device: torch.device | str) -> None:
    """Make ``device`` the current CUDA device of the calling thread (nothing for a CPU).

    Run it once at the start of every thread that launches work on the device, e.g. as the
    scoring thread's executor initializer::

        ThreadPoolExecutor(max_workers=1, initializer=bind_thread, initargs=(device,))

    Args:
        device: the model's device.

    Example::

        bind_thread(torch.device("cuda:1"))
        torch.cuda.current_device()  # 1 on this thread
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return
    if dev.index is None:  # "cuda": the device bound before, else this thread's current one
        dev = bound_device() or torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(dev)
    with _lock:
        _bound[:] = [dev]


def bound_device() -> torch.device | None:
    """The CUDA device this process last bound a thread to (:func:`rank_device`,
    :func:`bind_thread`), i.e. the GPU it serves on; ``None`` when it bound none.

    Threads that read the device without launching work on it (a metrics scrape) use this
    instead of their own current device, which is ``cuda:0`` in a fresh thread.

    Returns:
        The device, or ``None``.

    Example::

        device = bound_device()
        if device is not None:
            torch.cuda.memory_allocated(device)
    """
    with _lock:
        return _bound[0] if _bound else None


def serving_device(setting: str, local_rank: int) -> torch.device:
    """The device ``model.device`` names for this rank (made current on this thread).

    Args:
        setting: ``auto`` (:func:`rank_device`), ``cpu`` or ``cuda:N``.
        local_rank: this process's rank on its host.

    Returns:
        The device.

    Raises:
        DeviceUnavailableError: the setting names no device, or a GPU this host lacks.

    Example::

        serving_device("auto", local_rank=0)  # cuda:0 with a GPU, else cpu
    """
    if setting == "auto":
        return rank_device(local_rank)
    try:
        device = torch.device(setting)
    except RuntimeError as exc:
        raise DeviceUnavailableError(
            f"model.device = {setting!r} is not a device (auto, cpu or cuda:N)"
        ) from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"model.device = {setting!r} but CUDA is not available here (use auto or cpu)"
            )
        bind_thread(device)
    return device
