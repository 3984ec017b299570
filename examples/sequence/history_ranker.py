"""A ranker that attends over a viewer's watch history: the user's own model for the sequence
example (examples/sequence), neither streamrank's nor TorchRec's.

Per scored row (a viewer, a candidate video):

- the pooled embeddings of an ``EmbeddingBagCollection`` (viewer, device, the candidate video,
  its genre), one vector each;
- the watch history through an ``EmbeddingCollection`` (unpooled: one vector per watched
  video), attended with the candidate video's vector as the query (target attention, as in
  DIN): a softmax over the history's scaled dot products, masked to its length; a row without
  history attends to nothing (a zero vector);
- the dense features through a small MLP;

all concatenated into an MLP that returns one logit per row.

Example::

    model = HistoryRanker(ebc, ec, dense_in_features=5, history_length=10)
    logits = model(dense, kjt)      # [rows, 1]
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

__all__ = ["HistoryRanker"]


class HistoryRanker(nn.Module):
    """Pooled features, an attended history and dense features -> one logit per row.

    Args:
        embedding_bag_collection: the pooled tables (one of them looked up by ``query_key``).
        embedding_collection: the sequence table of ``history_key`` (same width as the query's).
        dense_in_features: width of the dense input.
        history_length: the most ids of a history (shorter ones are masked).
        query_key: the pooled key whose vector queries the history (the candidate video).
        history_key: the sequence key.
        hidden: width of the hidden layers.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        embedding_collection: EmbeddingCollection,
        dense_in_features: int,
        history_length: int,
        query_key: str = "video",
        history_key: str = "history",
        hidden: int = 32,
    ) -> None:
        super().__init__()
        self.ebc = embedding_bag_collection
        self.ec = embedding_collection
        self.history_length = history_length
        self.query_key = query_key
        self.history_key = history_key
        configs = self.ebc.embedding_bag_configs()
        self.pooled_keys = [key for c in configs for key in c.feature_names]
        pooled = sum(c.embedding_dim * len(c.feature_names) for c in configs)
        self.dim = self.ec.embedding_configs()[0].embedding_dim
        self.dense = nn.Sequential(nn.Linear(dense_in_features, hidden), nn.ReLU())
        self.over = nn.Sequential(
            nn.Linear(hidden + pooled + self.dim, hidden), nn.ReLU(), nn.Linear(hidden, 1)
        )

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        pooled = self.ebc(sparse_features)
        query = pooled[self.query_key]  # [rows, dim]
        history = self.ec(sparse_features)[self.history_key]
        padded = history.to_padded_dense(self.history_length)  # [rows, length, dim]
        positions = torch.arange(self.history_length, device=padded.device)
        mask = positions[None, :] < history.lengths()[:, None]
        scores = (padded @ query.unsqueeze(2)).squeeze(2) / math.sqrt(self.dim)
        # Masked positions weigh nothing; a row without history spreads its attention over
        # padding (zeros), so it attends to nothing.
        attention = torch.softmax(scores.masked_fill(~mask, -1e9), dim=1)
        attended = (attention.unsqueeze(2) * padded).sum(dim=1)
        # By key, not by position: a sharded collection orders its output by how it is sharded.
        vectors = [pooled[key] for key in self.pooled_keys]
        joined = torch.cat([self.dense(dense_features), *vectors, attended], dim=1)
        return self.over(joined)
