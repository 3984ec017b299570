"""Which device this process (or rank) runs the model on: one choice for every serving path."""

from __future__ import annotations

import torch

__all__ = ["rank_device", "serving_device"]


def rank_device(local_rank: int) -> torch.device:
    """``cuda:<local_rank>`` when CUDA is available (and made current), else ``cpu``.

    Args:
        local_rank: the process's rank on its host (``LOCAL_RANK`` under torchrun; 0 for a
            single process).

    Returns:
        The device to put this rank's model and batches on.

    Example::

        device = rank_device(RankContext.from_env().local_rank)
    """
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def serving_device(setting: str, local_rank: int) -> torch.device:
    """The device ``model.device`` names for this rank.

    Args:
        setting: ``auto`` (:func:`rank_device`), ``cpu`` or ``cuda:N``.
        local_rank: this process's rank on its host.

    Returns:
        The device (a CUDA device is made current).

    Raises:
        ValueError: the setting names no device torch knows, or CUDA is not available.

    Example::

        serving_device("auto", local_rank=0)  # cuda:0 with a GPU, else cpu
    """
    if setting == "auto":
        return rank_device(local_rank)
    try:
        device = torch.device(setting)
    except RuntimeError as exc:
        raise ValueError(f"model.device = {setting!r} is not a device (auto, cpu, cuda:N)") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"model.device = {setting!r} but CUDA is not available here")
        torch.cuda.set_device(device)
    return device
