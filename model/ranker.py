"""The built-in ranker: TorchRec's ``DLRM`` over one embedding table per sparse feature.

It is one module behind the model contract (:mod:`model.module`): its factory is
:func:`ranker_from_collection`, :func:`builtin_module_config` describes it, and
:func:`build_ranker` builds it through :func:`model.module.factory.build_module` like any
configured module. The tables live in a TorchRec ``EmbeddingBagCollection`` (``sparse_arch``),
so the module can be handed to ``DistributedModelParallel`` as is; build it with
``embedding_device="meta"`` to let the sharder allocate the tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from model.features.model_input import ModelInput
from model.features.spec import FeatureSpec, spec_from_dict, spec_to_dict
from model.module.factory import build_module
from model.module.factory import embedding_bag_configs as table_bag_configs
from model.module.types import Activation, ModuleConfig, OutputConfig
from model.serving.inference import score_probabilities

__all__ = [
    "Ranker",
    "build_ranker",
    "builtin_module_config",
    "embedding_bag_configs",
    "ranker_from_collection",
]


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
    return table_bag_configs(spec.table_configs())


class Ranker(nn.Module):
    """Click-probability model for (event, candidate) rows.

    Args:
        spec: input layout and architecture.
        embedding_bag_collection: its tables (:func:`embedding_bag_configs`), on any device
            (``meta``: unallocated, for ``DistributedModelParallel``).
        device: where the dense MLPs live.

    Example::

        ranker = build_ranker(FeatureSpec())
        probs = ranker.score(build_model_input(cols, spec))
    """

    def __init__(
        self,
        spec: FeatureSpec,
        embedding_bag_collection: EmbeddingBagCollection,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        self.spec = spec
        self.model = DLRM(
            embedding_bag_collection=embedding_bag_collection,
            dense_in_features=spec.dense_dim,
            dense_arch_layer_sizes=list(spec.dense_arch),
            over_arch_layer_sizes=list(spec.over_arch),
            dense_device=torch.device(device),
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


def ranker_from_collection(
    embedding_bag_collection: EmbeddingBagCollection,
    spec: Mapping[str, Any],
    dense_device: torch.device | str = "cpu",
) -> Ranker:
    """The built-in ranker's factory (the model contract's ``factory``).

    Args:
        embedding_bag_collection: the tables streamrank built from the spec's.
        spec: the :class:`FeatureSpec` as :func:`~model.features.spec.spec_to_dict` writes it.
        dense_device: where the dense MLPs live.

    Returns:
        The ranker.
    """
    return Ranker(spec_from_dict(spec), embedding_bag_collection, dense_device)


def builtin_module_config(spec: FeatureSpec) -> ModuleConfig:
    """The built-in ranker of ``spec``, described as any configured module is.

    Example::

        module = build_module(builtin_module_config(spec), seed=0)
    """
    return ModuleConfig(
        factory="model.ranker:ranker_from_collection",
        kwargs={"spec": spec_to_dict(spec)},
        tables=spec.table_configs(),
        output=OutputConfig(Activation.LOGITS),
        device_argument="dense_device",
    )


def build_ranker(
    spec: FeatureSpec,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    embedding_device: torch.device | str | None = None,
) -> Ranker:
    """Construct a freshly initialised :class:`Ranker` (through the model contract's factory).

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
    ranker = build_module(builtin_module_config(spec), device, embedding_device, seed)
    assert isinstance(ranker, Ranker)
    return ranker
