"""The model contract's factory: TorchRec's models built from TOML-shaped config, and every
mistake told in one line naming the key."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torchrec.models.deepfm import SimpleDeepFMNN
from torchrec.models.dlrm import DLRM_DCN

from model.features.spec import FeatureSpec
from model.module.factory import build_module, load_factory
from model.module.types import ModelConfigError, ModuleConfig, TableConfig
from model.ranker import Ranker, build_ranker, builtin_module_config
from tests.model.module.configs import DCN, DEEPFM


def _one_line(error: pytest.ExceptionInfo[ModelConfigError]) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_torchrec_models_are_built_from_the_config_alone() -> None:
    deepfm = build_module(DEEPFM, seed=0)
    dcn = build_module(DCN, seed=0)
    assert isinstance(deepfm, SimpleDeepFMNN) and isinstance(dcn, DLRM_DCN)
    ebc = deepfm.sparse_arch.embedding_bag_collection
    assert [c.name for c in ebc.embedding_bag_configs()] == ["t_user", "t_item", "t_recent"]
    assert [c.num_embeddings for c in ebc.embedding_bag_configs()] == [50, 80, 80]


def test_a_seed_makes_the_weights_repeatable_and_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(5)
    before = torch.rand(1)
    torch.manual_seed(5)
    a = build_module(DCN, seed=1).state_dict()
    assert torch.equal(torch.rand(1), before)
    b = build_module(DCN, seed=1).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = build_module(DCN, seed=2).state_dict()
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_tables_can_stay_on_the_meta_device_for_sharding() -> None:
    module = build_module(DEEPFM, embedding_device="meta")
    assert isinstance(module, SimpleDeepFMNN)
    tables = module.sparse_arch.embedding_bag_collection.parameters()
    assert all(p.is_meta for p in tables)
    assert not any(p.is_meta for p in module.dense_arch.parameters())


def test_the_builtin_ranker_is_one_module_behind_the_contract() -> None:
    spec = FeatureSpec.from_settings({"embedding_dim": 8, "dense_arch": [16, 8]})
    config = builtin_module_config(spec)
    assert config.factory == "model.ranker:ranker_from_collection"
    ranker = build_module(config, seed=4)
    assert isinstance(ranker, Ranker) and ranker.spec == spec
    same = build_ranker(spec, seed=4)
    assert all(torch.equal(v, same.state_dict()[k]) for k, v in ranker.state_dict().items())


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        ("no_such_package.models:Net", "cannot import no_such_package.models"),
        ("torchrec.models.deepfm:NoSuchModel", "torchrec.models.deepfm has no NoSuchModel"),
        ("torchrec.models.deepfm:__name__", "is not callable"),
    ],
)
def test_a_factory_that_cannot_be_imported_is_one_line(factory: str, says: str) -> None:
    with pytest.raises(ModelConfigError) as error:
        load_factory(dataclasses.replace(DEEPFM, factory=factory))
    assert "model.module.factory" in _one_line(error) and says in str(error.value)


def test_a_factory_without_a_colon_is_refused() -> None:
    with pytest.raises(ModelConfigError, match=r"package\.module:function"):
        dataclasses.replace(DEEPFM, factory="torchrec.models.deepfm.SimpleDeepFMNN")


def test_user_code_comes_from_the_configured_code_dir(tmp_path: Path) -> None:
    package = tmp_path / "team_models"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ranker.py").write_text(
        "import torch\n"
        "class Scorer(torch.nn.Module):\n"
        "    def __init__(self, embedding_bag_collection, width):\n"
        "        super().__init__()\n"
        "        self.ebc = embedding_bag_collection\n"
        "        self.head = torch.nn.Linear(width + 4, 2)\n"
        "    def forward(self, dense_features, sparse_features):\n"
        "        pooled = self.ebc(sparse_features).values()\n"
        "        return self.head(torch.cat([dense_features, pooled], dim=1))\n"
    )
    config = ModuleConfig(
        "team_models.ranker:Scorer",
        {"width": 3},
        (TableConfig("t_a", 10, 4, ("a",)),),
        code_dir=str(tmp_path),
    )
    with pytest.raises(ModelConfigError, match="cannot import team_models"):
        load_factory(dataclasses.replace(config, code_dir=""))
    module = build_module(config)
    assert type(module).__name__ == "Scorer" and isinstance(module, nn.Module)
    assert str(tmp_path) not in sys.path  # only while importing


def test_torchrecs_constraints_are_checked_before_torchrec_asserts() -> None:
    two_dims = dataclasses.replace(
        DEEPFM, tables=(TableConfig("t_a", 5, 8, ("a",)), TableConfig("t_b", 5, 4, ("b",)))
    )
    with pytest.raises(ModelConfigError) as error:
        build_module(two_dims)
    assert "one embedding_dim for every table, got [4, 8]" in _one_line(error)
    kwargs = {**DCN.kwargs, "dense_arch_layer_sizes": [16, 12]}
    with pytest.raises(ModelConfigError) as error:
        build_module(dataclasses.replace(DCN, kwargs=kwargs))
    assert "dense_arch_layer_sizes [16, 12]" in _one_line(error)
    assert "equal to embedding_dim 8" in str(error.value)


def test_a_factory_failing_on_its_kwargs_is_one_line() -> None:
    kwargs = {**DEEPFM.kwargs, "hidden_layers": 3}
    with pytest.raises(ModelConfigError) as error:
        build_module(dataclasses.replace(DEEPFM, kwargs=kwargs))
    assert "failed with the configured kwargs: TypeError" in _one_line(error)


def test_bad_tables_are_refused_naming_them() -> None:
    with pytest.raises(ModelConfigError, match="table names repeat"):
        dataclasses.replace(DEEPFM, tables=DEEPFM.tables[:1] * 2)
    with pytest.raises(ModelConfigError, match="looked up in two tables"):
        dataclasses.replace(
            DEEPFM, tables=(TableConfig("a", 5, 8, ("x",)), TableConfig("b", 5, 8, ("x",)))
        )
    with pytest.raises(ModelConfigError, match="num_embeddings and embedding_dim"):
        TableConfig("t", 0, 8, ("x",))
    with pytest.raises(ModelConfigError, match=r"kwargs\.embedding_bag_collection"):
        dataclasses.replace(DEEPFM, kwargs={**DEEPFM.kwargs, "embedding_bag_collection": 1})
