"""What the contract serves and how a mismatch is told: module kinds, features, dense width,
output shape, output scores."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from model.features.layout import InputLayout
from model.module.checks import check_features, module_tables, trial_forward
from model.module.factory import build_module
from model.module.output import output_scores
from model.module.types import Activation, ModelConfigError, ModuleConfig, OutputConfig
from tests.model.module.configs import DCN, DCN_LAYOUT, DEEPFM, DEEPFM_LAYOUT


class PooledLinear(nn.Module):
    """A user's own module: pooled embeddings next to the dense input, two task columns."""

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection, inputs: int) -> None:
        super().__init__()
        self.ebc = embedding_bag_collection
        dim = sum(c.embedding_dim for c in embedding_bag_collection.embedding_bag_configs())
        self.head = nn.Linear(inputs + dim, 2)

    def forward(self, dense_features: torch.Tensor, sparse_features: object) -> torch.Tensor:
        pooled = self.ebc(sparse_features).values()
        return self.head(torch.cat([dense_features, pooled], dim=1))


class _Holder(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner


def test_module_tables_are_read_off_the_module_with_their_paths() -> None:
    tables = module_tables(build_module(DEEPFM, embedding_device="meta"), {"recent": 4})
    assert [t.name for t in tables] == ["t_user", "t_item", "t_recent"]
    assert {t.module_path for t in tables} == {"sparse_arch.embedding_bag_collection"}
    assert [t.ids_per_row for t in tables] == [1, 1, 4]
    assert [t.num_embeddings for t in tables] == [50, 80, 80]


def test_every_kjt_key_is_a_module_feature_and_back() -> None:
    check_features(DEEPFM, ["user", "item", "recent"])
    with pytest.raises(ModelConfigError, match=r"features.sparse.country: the module has no"):
        check_features(DEEPFM, ["user", "item", "recent", "country"])
    with pytest.raises(ModelConfigError, match=r"'recent' has no \[features.sparse.recent\]"):
        check_features(DEEPFM, ["user", "item"])


def test_the_trial_forward_accepts_the_configured_width_and_counts_columns() -> None:
    assert trial_forward(DEEPFM, DEEPFM_LAYOUT) == 1
    assert trial_forward(DCN, DCN_LAYOUT) == 1


def test_a_dense_width_mismatch_is_one_line() -> None:
    wide = dataclasses.replace(DEEPFM_LAYOUT, dense_dim=5)
    with pytest.raises(ModelConfigError) as error:
        trial_forward(DEEPFM, wide)
    assert str(error.value) == (
        "features.dense: the dense input is 5 wide but num_dense_features = 3 in "
        "[model.module.kwargs]"
    )
    # Without a width keyword TorchRec knows, the module's own forward tells.
    own = ModuleConfig(
        "tests.model.module.test_checks:PooledLinear", {"inputs": 3}, DEEPFM.tables[:1]
    )
    assert trial_forward(own, InputLayout(("user",), 3, (1,))) == 2
    with pytest.raises(ModelConfigError) as error:
        trial_forward(own, InputLayout(("user",), 6, (1,)))
    assert str(error.value).startswith(
        "features.dense: a trial forward with a dense input 6 wide failed: RuntimeError: "
    )
    assert "\n" not in str(error.value)


def test_output_columns_are_checked_against_the_output_config() -> None:
    two_tasks = {**DCN.kwargs, "over_arch_layer_sizes": [16, 2]}
    config = dataclasses.replace(DCN, kwargs=two_tasks, output=OutputConfig(score_column=1))
    assert trial_forward(config, DCN_LAYOUT) == 2
    with pytest.raises(ModelConfigError, match="score_column = 2: the module returns 2"):
        trial_forward(dataclasses.replace(config, output=OutputConfig(score_column=2)), DCN_LAYOUT)
    weighted = dataclasses.replace(config, output=OutputConfig(score_weights=(1.0, 2.0, 3.0)))
    with pytest.raises(ModelConfigError, match="3 weights for an output of 2 column"):
        trial_forward(weighted, DCN_LAYOUT)
    named = dataclasses.replace(config, output=OutputConfig(column_names=("click",)))
    with pytest.raises(ModelConfigError, match="output_names: 1 names for an output of 2 col"):
        trial_forward(named, DCN_LAYOUT)
    with pytest.raises(ModelConfigError, match="output_names = \\['a', 'a'\\]: names must be"):
        OutputConfig(column_names=("a", "a"))


def test_scores_follow_the_output_config() -> None:
    logits = torch.tensor([[0.0, 2.0], [-1.0, 1.0]])
    sig = torch.sigmoid(logits)
    assert torch.allclose(output_scores(logits, OutputConfig(score_column=1)), sig[:, 1])
    both = output_scores(logits, OutputConfig(score_weights=(0.25, 0.75)))
    assert torch.allclose(both, sig @ torch.tensor([0.25, 0.75]))
    probs = torch.tensor([0.2, 0.9])
    assert torch.equal(output_scores(probs, OutputConfig(Activation.PROBABILITIES)), probs)
    assert output_scores(torch.zeros(0)).shape == (0,)
    # published task columns come beside the ranking score, after the same activation
    published = OutputConfig(score_weights=(0.25, 0.75), task_columns=(1, 0))
    table = output_scores(logits, published)
    assert table.shape == (2, 3)
    assert torch.allclose(table[:, 0], sig @ torch.tensor([0.25, 0.75]))
    assert torch.equal(table[:, 1:], sig[:, [1, 0]])


def test_a_layout_with_a_key_the_module_lacks_fails_the_trial_forward() -> None:
    layout = InputLayout(("user", "item"), 3, (1, 1))
    with pytest.raises(ModelConfigError, match="trial forward"):
        trial_forward(DEEPFM, layout)
