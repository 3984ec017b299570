"""The module's output -> one ranking score per row.

A module returns ``[R]``, ``[R, 1]`` or ``[R, T]``: logits (turned into probabilities by a
sigmoid) or probabilities already (:class:`~model.module.types.Activation`). The ranking score is
one column, or a weighted sum of the columns (:class:`~model.module.types.OutputConfig`).

Example::

    scores = output_scores(module(dense, sparse), OutputConfig(Activation.PROBABILITIES))
"""

from __future__ import annotations

import torch

from model.module.types import Activation, OutputConfig

__all__ = ["DEFAULT_OUTPUT", "output_scores"]

DEFAULT_OUTPUT = OutputConfig()
"""Logits, one column: the built-in ranker's output."""


def output_scores(out: torch.Tensor, config: OutputConfig = DEFAULT_OUTPUT) -> torch.Tensor:
    """float32 scores in ``[0, 1]``, one per row of ``out``.

    Args:
        out: the module's output, ``[R]``, ``[R, 1]`` or ``[R, T]``.
        config: activation and which column (or weighted sum) ranks.

    Returns:
        float32[R].
    """
    columns = (out.unsqueeze(1) if out.dim() == 1 else out.flatten(1)).float()
    if config.activation is Activation.LOGITS:
        columns = torch.sigmoid(columns)
    if config.score_weights:
        weights = torch.tensor(config.score_weights, dtype=columns.dtype, device=columns.device)
        return columns @ weights
    return columns[:, config.score_column]
