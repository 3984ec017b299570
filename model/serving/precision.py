"""Numeric precision of the forward: fp32, TF32 matmuls, or bf16 autocast.

Measured on an H200 with the default DLRM (``../shared/reference/measured-facts.md``): TF32
matmuls about 1.75x fp32 rows/s, bf16 autocast about 2.1x with a largest score change of 1.9e-3.
On a CPU there are no TF32 units, so ``tf32`` computes exactly like ``fp32`` there; bf16
autocast runs on CPUs too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from model.options import Precision

__all__ = ["Precision", "precision_scope"]


@contextlib.contextmanager
def precision_scope(precision: Precision | str, device: torch.device) -> Iterator[None]:
    """Run the block (one forward) at ``precision`` on ``device``.

    TF32 switches ``torch.backends.cuda.matmul.allow_tf32`` (and cuDNN's) on for the block and
    restores them after; keep one forward at a time per process (the pipeline's forward
    executor does).

    Args:
        precision: a :class:`Precision` or its value.
        device: the forward's device.

    Example::

        with precision_scope(Precision.BF16, torch.device("cuda:0")):
            logits = ranker(inp.dense, inp.sparse)
    """
    chosen = Precision(precision)
    if chosen is Precision.BF16:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            yield
    elif chosen is Precision.TF32 and device.type == "cuda":
        matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = matmul
            torch.backends.cudnn.allow_tf32 = cudnn
    else:
        yield
