"""Which device this process (or rank) runs the model on."""

from __future__ import annotations

import torch

__all__ = ["rank_device"]


def rank_device(local_rank: int) -> torch.device:
    """``cuda:<local_rank>`` when CUDA is available (and made current), else ``cpu``.

    Args:
        local_rank: the process's rank on its host (``LOCAL_RANK`` under torchrun; 0 for a
            single process).

    Returns:
        The device to put this rank's model and batches on.

    Example::

        device = rank_device(int(os.environ.get("LOCAL_RANK", "0")))
    """
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")
