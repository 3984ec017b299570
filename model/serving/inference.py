"""The one scoring forward: one score per row of a batch, shared by tests and serving."""

from __future__ import annotations

import torch
from torch import nn

from model.features.model_input import ModelInput, pad_model_input
from model.module.output import DEFAULT_OUTPUT, output_scores
from model.module.types import OutputConfig
from model.serving.precision import Precision, precision_scope

__all__ = ["score_probabilities"]


def score_probabilities(
    module: nn.Module,
    inp: ModelInput,
    pad_to: int | None = None,
    precision: Precision | str = Precision.FP32,
    output: OutputConfig = DEFAULT_OUTPUT,
) -> torch.Tensor:
    """Scores of ``inp``'s rows: one forward, then the output config (default: ``sigmoid`` of
    the logits, the built-in ranker's click probabilities).

    Runs under ``torch.no_grad()``, not ``torch.inference_mode()``: the fused FBGEMM kernel of
    sharded tables has no CPU inference-mode implementation ("Could not run
    'fbgemm::split_embedding_codegen_lookup_sgd_function_pt2' with arguments from the 'CPU'
    backend"). A sharded model's forward is collective: every rank calls this together, each
    with its own batch (zero rows included).

    Args:
        module: anything with ``forward(dense, sparse) -> Tensor[R] | [R, T]``: a
            :class:`~model.ranker.Ranker`, any configured module (:mod:`model.module`), a
            quantized or compiled one, or a ``DistributedModelParallel``-wrapped one.
        inp: the batch, on the module's device.
        pad_to: pad the batch with empty rows to this many rows before the forward (ranks of a
            sharded model agree on one row count); the padding's scores are dropped. ``None``
            or a value ``<= inp.num_rows`` runs the batch as is.
        precision: see :mod:`model.serving.precision`; the scores are float32 either way.
        output: logits or probabilities, which column ranks, which columns are published
            (:func:`model.module.output.output_scores`).

    Returns:
        float32[inp.num_rows] scores in ``[0, 1]``; float32[inp.num_rows, 1 + P] with
        ``output.task_columns`` (the ranking score first, then the published columns).

    Example::

        probs = score_probabilities(ranker, build_model_input(cols, spec))
        probs = score_probabilities(dmp, inp.to(device), pad_to=1024)  # on every rank
    """
    rows = inp.num_rows
    if pad_to is not None and pad_to > rows:
        inp = pad_model_input(inp, pad_to)
    with torch.no_grad(), precision_scope(precision, inp.dense.device):
        out: torch.Tensor = module(inp.dense, inp.sparse)
    return output_scores(out[:rows], output)
