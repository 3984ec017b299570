"""Serving in one process: load the checkpoint, quantize the tables, compile (strategy of
:class:`~model.serving.factory.ScorerFactory`)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from model.options import QuantDtype
from model.serving.compile import maybe_compile
from model.serving.memory import embedding_bytes
from model.serving.options import ServingOptions
from model.serving.quantize import quantize_ranker
from model.store.checkpoint import CheckpointMeta, load_checkpoint

__all__ = ["load_single"]

log = logging.getLogger(__name__)


def load_single(options: ServingOptions, device: torch.device) -> tuple[nn.Module, CheckpointMeta]:
    """The model as ``options`` ask for it, on ``device``, in this process alone.

    Args:
        options: checkpoint, quantization and compile options.
        device: where the model runs.

    Returns:
        The module to serve and the checkpoint's metadata.

    Example::

        module, meta = load_single(ServingOptions(Path("artifacts/model")), torch.device("cpu"))
    """
    ranker, meta = load_checkpoint(options.checkpoint, device=device)
    module: nn.Module = ranker
    if QuantDtype(options.quantize) is not QuantDtype.FP32:
        fp32_bytes = embedding_bytes(ranker)
        module = quantize_ranker(ranker, options.quantize)
        log.info(
            "embedding tables as %s: %.1f MiB (fp32 %.1f MiB)",
            QuantDtype(options.quantize).value,
            embedding_bytes(module) / 2**20,
            fp32_bytes / 2**20,
        )
    module = maybe_compile(module, options.compile, mode=options.compile_mode)
    log.info("loaded model %s from %s onto %s", meta.model_version, options.checkpoint, device)
    return module, meta
