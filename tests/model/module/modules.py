"""A user's module over a managed-collision collection: TorchRec's SimpleDeepFMNN behind an
adapter, as a user would write it (the tests' factory ``tests.model.module.modules:
managed_deepfm``).

TorchRec's models take an ``EmbeddingBagCollection``, whose forward returns the pooled
embeddings; a ``ManagedCollisionEmbeddingBagCollection`` returns ``(embeddings, remapped
features)``. :class:`Embeddings` is the adapter between the two.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torchrec.models.deepfm import SimpleDeepFMNN
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor


class Embeddings(nn.Module):
    """A managed-collision collection seen as an ``EmbeddingBagCollection``: the pooled
    embeddings of the remapped ids."""

    def __init__(self, managed: ManagedCollisionEmbeddingBagCollection) -> None:
        super().__init__()
        self.managed = managed

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self.managed._embedding_bag_collection.embedding_bag_configs()

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        pooled, _ = self.managed(features)
        assert isinstance(pooled, KeyedTensor)
        return pooled


def managed_deepfm(
    embedding_bag_collection: ManagedCollisionEmbeddingBagCollection, **kwargs: Any
) -> SimpleDeepFMNN:
    """SimpleDeepFMNN over the managed-collision collection streamrank builds."""
    return SimpleDeepFMNN(embedding_bag_collection=Embeddings(embedding_bag_collection), **kwargs)
