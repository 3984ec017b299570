"""The DeepFM example over a managed-collision collection, for the tests of
``[model.module.managed_collision]``: the user's module of tests/model/module/modules.py
(SimpleDeepFMNN over a ``ManagedCollisionEmbeddingBagCollection`` whose MCH remappers map raw
ids onto the tables' rows), its TOML, and versions trained on different ids (so their remapping
states differ).

Example::

    ex.toml.write_text(managed_toml(ex.toml.read_text()))
    state = trained_state(config, ex.script, seed=0, id_offset=0)  # remappers hold ids 0...
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from model.module.factory import build_module
from model.module.types import ModuleConfig

INPUT_HASH_SIZE = 1 << 20
"""The raw ids' range of the test's remappers (``managed_collision.input_hash_size``)."""


def trained_state(
    config: ModuleConfig, script: ModuleType, seed: int, id_offset: int, steps: int = 20
) -> dict[str, torch.Tensor]:
    """A version's weights: the module trained on the DeepFM example's synthetic batches with
    every raw id shifted by ``id_offset``, so that its remappers hold those ids (LFU, one
    eviction round per batch)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    module = build_module(config, "cpu", seed=seed).train()
    optimizer = torch.optim.Adam(module.parameters(), lr=0.01)
    for _ in range(steps):
        dense, sparse, clicks = script._training_batch(rng, 256)
        shifted = KeyedJaggedTensor.from_lengths_sync(
            keys=sparse.keys(), values=sparse.values() + id_offset, lengths=sparse.lengths()
        )
        loss = nn.functional.binary_cross_entropy(module(dense, shifted).squeeze(1), clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def managed_toml(text: str) -> str:
    """The DeepFM example's TOML with this module and its remappers."""
    text = text.replace(
        'factory = "torchrec.models.deepfm:SimpleDeepFMNN"',
        'factory = "tests.model.module.modules:managed_deepfm"',
    )
    return text + f"\n[model.module.managed_collision]\ninput_hash_size = {INPUT_HASH_SIZE}\n"
