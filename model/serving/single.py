"""Serving in one process: build the module, load its weights, quantize the tables, compile
(strategy of :class:`~model.serving.factory.ScorerFactory`)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from model.module.factory import build_module
from model.options import QuantDtype
from model.serving.compile import maybe_compile
from model.serving.memory import embedding_bytes
from model.serving.options import ServingOptions
from model.serving.quantize import quantize_ranker
from model.serving.served import ServedModule, load_weights

__all__ = ["load_single"]

log = logging.getLogger(__name__)


def load_single(options: ServingOptions, served: ServedModule, device: torch.device) -> nn.Module:
    """The module as ``options`` ask for it, on ``device``, in this process alone.

    Args:
        options: checkpoint, quantization and compile options.
        served: what the checkpoint holds (:func:`model.serving.served.describe_served`).
        device: where the model runs.

    Returns:
        The module to serve (eval mode).

    Example::

        options = ServingOptions(Path("artifacts/model"))
        module = load_single(options, describe_served(options), torch.device("cpu"))
    """
    module: nn.Module = build_module(served.config, device)
    load_weights(module, served, options.checkpoint)
    module.eval()
    if QuantDtype(options.quantize) is not QuantDtype.FP32:
        fp32_bytes = embedding_bytes(module)
        module = quantize_ranker(module, options.quantize)
        log.info(
            "embedding tables as %s: %.1f MiB (fp32 %.1f MiB)",
            QuantDtype(options.quantize).value,
            embedding_bytes(module) / 2**20,
            fp32_bytes / 2**20,
        )
    module = maybe_compile(module, options.compile, mode=options.compile_mode)
    log.info("loaded model %s from %s onto %s", served.model_version, options.checkpoint, device)
    return module
