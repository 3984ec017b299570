"""The module's output -> one ranking score per row (and the task columns an output publishes).

A module returns ``[R]``, ``[R, 1]`` or ``[R, T]``: logits (turned into probabilities by a
sigmoid) or probabilities already (:class:`~model.module.types.Activation`). The ranking score is
one column, or a weighted sum of the columns (:class:`~model.module.types.OutputConfig`). A
configured output schema may publish some columns by name (``task_columns``): they come back
beside the ranking score, after the same activation.

Example::

    scores = output_scores(module(dense, sparse), OutputConfig(Activation.PROBABILITIES))
    both = output_scores(out, OutputConfig(score_weights=(0.7, 0.3), task_columns=(0, 1)))
    both[:, 0]    # the ranking score; both[:, 1:] the two task columns
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
        config: activation, which column (or weighted sum) ranks, which columns are published.

    Returns:
        float32[R]; with ``config.task_columns``, float32[R, 1 + P]: the ranking score, then the
        ``P`` published columns in their order.
    """
    columns = (out.unsqueeze(1) if out.dim() == 1 else out.flatten(1)).float()
    if config.activation is Activation.LOGITS:
        columns = torch.sigmoid(columns)
    if config.score_weights:
        weights = torch.tensor(config.score_weights, dtype=columns.dtype, device=columns.device)
        ranking = columns @ weights
    else:
        ranking = columns[:, config.score_column]
    if not config.task_columns:
        return ranking
    tasks = columns[:, list(config.task_columns)]
    return torch.cat([ranking.unsqueeze(1), tasks], dim=1)
