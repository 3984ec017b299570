"""A configured module (TorchRec's DLRM_DCN with two task columns) and random model inputs of
its layout, for the ingest tests: several keys, one of them with several ids per row, bags of
every length up to the key's most (empty ones too)."""

from __future__ import annotations

import dataclasses

import torch

from model.features.layout import InputLayout
from model.features.model_input import ModelInput, sparse_features
from model.module.factory import build_module
from model.module.types import Activation, OutputConfig
from model.serving import Scorer
from tests.model.module.configs import DCN

TWO_TASKS = OutputConfig(Activation.LOGITS, score_weights=(0.7, 0.3), task_columns=(0, 1))
"""Rank by 0.7 sigmoid(click) + 0.3 sigmoid(purchase), publishing both columns."""
DCN_TWO_TASKS = dataclasses.replace(
    DCN,
    kwargs={**DCN.kwargs, "over_arch_layer_sizes": [16, 2]},
    output=TWO_TASKS,
)
LAYOUT = InputLayout(("user", "item", "country"), 4, (1, 3, 1))
"""The item key carries up to 3 ids per row."""
_ROWS = {"user": 60, "item": 90, "country": 7}


def dcn_scorer(seed: int = 0, version: str = "dcn-1") -> Scorer:
    """The module with weights of ``seed``, served with its two task columns."""
    module = build_module(DCN_TWO_TASKS, "cpu", seed=seed)
    return Scorer(module, LAYOUT, version, torch.device("cpu"), output=TWO_TASKS)


def random_input(rows: int, seed: int) -> ModelInput:
    """``rows`` rows of :data:`LAYOUT`: random ids inside each table, bag lengths from 0 to
    the key's most."""
    gen = torch.Generator().manual_seed(seed)
    lengths, values, per_key = [], [], []
    for key, most in zip(LAYOUT.keys, LAYOUT.ids_per_key, strict=True):
        counts = torch.randint(0, most + 1, (rows,), generator=gen)
        lengths.append(counts)
        values.append(torch.randint(0, _ROWS[key], (int(counts.sum()),), generator=gen))
        per_key.append(int(counts.sum()))
    sparse = sparse_features(LAYOUT.keys, torch.cat(values), torch.cat(lengths), rows, per_key)
    dense = torch.rand((rows, LAYOUT.dense_dim), generator=gen)
    return ModelInput(dense, sparse)
