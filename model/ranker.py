"""The DLRM ranker: TorchRec's ``DLRM`` over one embedding table per sparse feature.

The embedding tables live in a TorchRec ``EmbeddingBagCollection`` (``sparse_arch``), so the
module can be handed to ``DistributedModelParallel`` as is; build it with
``embedding_device="meta"`` to let the sharder allocate the tables.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from model.features.model_input import ModelInput
from model.features.spec import FeatureSpec
from model.serving.inference import score_probabilities

__all__ = ["Ranker", "build_ranker", "embedding_bag_configs"]


def embedding_bag_configs(spec: FeatureSpec) -> list[EmbeddingBagConfig]:
    """One SUM-pooled ``EmbeddingBagConfig`` per table of ``spec``, in KJT key order.

    Args:
        spec: the feature spec.

    Returns:
        Configs named ``TableSpec.name`` (e.g. ``t_user_id``) with
        ``feature_names=[feature.value]``.

    Example::

        ebc = EmbeddingBagCollection(tables=embedding_bag_configs(spec), device="meta")
    """
    return [
        EmbeddingBagConfig(
            name=t.name,
            embedding_dim=spec.embedding_dim,
            num_embeddings=t.num_embeddings,
            feature_names=[t.feature.value],
            pooling=PoolingType.SUM,
        )
        for t in spec.tables
    ]


class Ranker(nn.Module):
    """Click-probability model for (event, candidate) rows.

    Args:
        spec: input layout and architecture.
        device: where the dense MLPs live.
        embedding_device: where the embedding tables are allocated; ``"meta"`` leaves them
            unallocated (for ``DistributedModelParallel``). Defaults to ``device``.

    Example::

        ranker = Ranker(FeatureSpec())
        probs = ranker.score(build_model_input(cols, spec))
    """

    def __init__(
        self,
        spec: FeatureSpec,
        device: torch.device | str = "cpu",
        embedding_device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        dense_device = torch.device(device)
        ebc_device = dense_device if embedding_device is None else torch.device(embedding_device)
        ebc = EmbeddingBagCollection(tables=embedding_bag_configs(spec), device=ebc_device)
        self.model = DLRM(
            embedding_bag_collection=ebc,
            dense_in_features=spec.dense_dim,
            dense_arch_layer_sizes=list(spec.dense_arch),
            over_arch_layer_sizes=list(spec.over_arch),
            dense_device=dense_device,
        )

    @property
    def embedding_bag_collection(self) -> EmbeddingBagCollection:
        """The (unsharded) table collection."""
        ebc = self.model.sparse_arch.embedding_bag_collection
        assert isinstance(ebc, EmbeddingBagCollection)
        return ebc

    def forward(self, dense: torch.Tensor, sparse: KeyedJaggedTensor) -> torch.Tensor:
        """Logits for ``R`` rows.

        Args:
            dense: float32[R, spec.dense_dim].
            sparse: KJT with keys ``spec.feature_names`` and stride ``R``.

        Returns:
            float32[R] logits.
        """
        logits: torch.Tensor = self.model(dense, sparse)
        return logits.reshape(-1)

    def score(self, inp: ModelInput) -> torch.Tensor:
        """Click probabilities, without autograd
        (:func:`model.serving.inference.score_probabilities`).

        Args:
            inp: the batch, already on the model's device.

        Returns:
            float32[R] probabilities in ``[0, 1]``.
        """
        return score_probabilities(self, inp)


def build_ranker(
    spec: FeatureSpec,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    embedding_device: torch.device | str | None = None,
) -> Ranker:
    """Construct a freshly initialised :class:`Ranker`.

    Args:
        spec: input layout and architecture.
        device: device of the dense MLPs (and of the tables unless ``embedding_device``).
        seed: if given, initialisation is deterministic; the global torch RNG is left untouched
            either way when a seed is given.
        embedding_device: e.g. ``"meta"`` to skip allocating the tables.

    Returns:
        The ranker in training mode.

    Example::

        ranker = build_ranker(spec, seed=0)
        sharded_ready = build_ranker(spec, embedding_device="meta")
    """
    if seed is None:
        return Ranker(spec, device=device, embedding_device=embedding_device)
    devices = [d for d in (torch.device(device),) if d.type == "cuda"]
    with torch.random.fork_rng(devices=[d.index or 0 for d in devices]):
        torch.manual_seed(seed)
        return Ranker(spec, device=device, embedding_device=embedding_device)
