"""The collections streamrank builds from [[model.module.tables]]: sequence tables (an
EmbeddingCollection under its own keyword), a weighted pooled collection, managed collisions;
what a module holds (module_tables, refusals) and every mistake in one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.feature_processor_ import PositionWeightedModule
from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from torchrec.modules.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from torchrec.modules.mc_modules import (
    LFU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)

from model.module.checks import (
    check_collections,
    collections,
    managed_collisions,
    module_tables,
    trial_forward,
)
from model.module.factory import build_collections, build_module
from model.module.store import check_architecture, import_state_dict, load_module_meta
from model.module.types import ManagedCollision, ModelConfigError, ModuleConfig, TableConfig
from model.store.versions import ModelVersions
from tests.model.module.configs import (
    DEEPFM,
    DEEPFM_LAYOUT,
    MANAGED,
    SEQUENCE,
    SEQUENCE_LAYOUT,
    WEIGHTED,
    WEIGHTED_LAYOUT,
)


def test_sequence_tables_are_an_embedding_collection_under_their_own_keyword() -> None:
    built = build_collections(SEQUENCE, "meta")
    assert set(built) == {"embedding_bag_collection", "embedding_collection"}
    ebc, ec = built["embedding_bag_collection"], built["embedding_collection"]
    assert isinstance(ebc, EmbeddingBagCollection) and isinstance(ec, EmbeddingCollection)
    assert [c.name for c in ebc.embedding_bag_configs()] == ["t_user", "t_item"]
    assert [c.name for c in ec.embedding_configs()] == ["t_history"]
    assert ec.device == torch.device("meta")  # what TorchRec's sharder compares it with
    module = build_module(SEQUENCE, seed=0)
    tables = module_tables(module, {"history": 4})
    assert [(t.name, t.kind, t.module_path, t.ids_per_row) for t in tables] == [
        ("t_user", "bag", "ebc", 1),
        ("t_item", "bag", "ebc", 1),
        ("t_history", "sequence", "ec", 4),
    ]
    assert trial_forward(SEQUENCE, SEQUENCE_LAYOUT) == 1


def test_a_weighted_collection_takes_the_weights_of_the_kjt() -> None:
    ebc = build_collections(WEIGHTED, "cpu")["embedding_bag_collection"]
    assert isinstance(ebc, EmbeddingBagCollection) and ebc.is_weighted()
    assert trial_forward(WEIGHTED, WEIGHTED_LAYOUT) == 1
    plain = dataclasses.replace(WEIGHTED_LAYOUT, weighted=False)
    with pytest.raises(ModelConfigError, match="a trial forward"):  # the KJT lacks weights
        trial_forward(WEIGHTED, plain)


def test_managed_collisions_put_a_remapper_before_every_pooled_table() -> None:
    built = build_collections(MANAGED, "cpu")["embedding_bag_collection"]
    assert isinstance(built, ManagedCollisionEmbeddingBagCollection)
    remappers = built._managed_collision_collection._managed_collision_modules
    assert set(remappers) == {"t_user", "t_item", "t_recent"}
    assert [m.output_size() for m in remappers.values()] == [50, 80, 80]
    assert {m.input_size() for m in remappers.values()} == {1000}
    module = build_module(MANAGED, seed=0)
    assert managed_collisions(module) == ["sparse_arch.embedding_bag_collection.managed"]
    tables = module_tables(module)
    assert [t.name for t in tables] == ["t_user", "t_item", "t_recent"]  # its EBC's, once
    assert {t.module_path for t in tables} == {"sparse_arch.embedding_bag_collection.managed"}
    state = module.state_dict()
    assert any(k.endswith("t_user._mch_sorted_raw_ids") for k in state)  # part of a version
    assert trial_forward(MANAGED, DEEPFM_LAYOUT) == 1


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"sequence_collection_argument": ""},
            "model.module.tables: t_history is a sequence table: set "
            "model.module.sequence_collection_argument",
        ),
        (
            {"sequence_collection_argument": "embedding_bag_collection"},
            "model.module.sequence_collection_argument: the same keyword as collection_argument",
        ),
        (
            {"kwargs": {"embedding_collection": 1}},
            "model.module.kwargs.embedding_collection: streamrank passes the collection",
        ),
        (
            {"extra": TableConfig("t_more", 9, 4, ("more",), kind="sequence")},
            "the sequence tables have embedding_dim [4, 8]; TorchRec's EmbeddingCollection needs "
            "one",
        ),
        (
            {"weighted": True, "mean": True},
            "model.module.weighted: table t_user pools by mean; TorchRec's weighted "
            "EmbeddingBagCollection sums",
        ),
        (
            {"weighted": True, "only_sequence": True},
            "model.module.weighted: applies to the pooled tables, and every table is a sequence",
        ),
    ],
)
def test_a_collection_mistake_is_one_line(changes: dict[str, Any], says: str) -> None:
    tables = list(SEQUENCE.tables)
    if changes.pop("extra", None) is not None:
        tables.append(TableConfig("t_more", 9, 4, ("more",), kind="sequence"))
    if changes.pop("mean", False):
        tables[0] = dataclasses.replace(tables[0], pooling="mean")
    if changes.pop("only_sequence", False):
        tables = [t for t in tables if t.sequence]
    with pytest.raises(ModelConfigError) as error:
        dataclasses.replace(SEQUENCE, tables=tuple(tables), **changes)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_a_sequence_table_does_not_pool_and_managed_collisions_need_a_range() -> None:
    with pytest.raises(ModelConfigError, match="a sequence table does not pool"):
        TableConfig("t", 5, 4, ("a",), pooling="mean", kind="sequence")
    with pytest.raises(ModelConfigError, match="kind must be bag or sequence"):
        TableConfig("t", 5, 4, ("a",), kind="list")
    with pytest.raises(ModelConfigError, match="input_hash_size must be >= 1"):
        ManagedCollision(input_hash_size=0)
    with pytest.raises(ModelConfigError, match="eviction_policy 'fifo': expected one of lfu"):
        ManagedCollision(input_hash_size=10, eviction_policy="fifo")


def test_the_architecture_of_a_plain_module_reads_as_before() -> None:
    assert set(DEEPFM.architecture()) == {"factory", "kwargs", "tables"}
    assert all("kind" not in t for t in DEEPFM.architecture()["tables"])
    assert SEQUENCE.architecture()["tables"][2]["kind"] == "sequence"
    assert WEIGHTED.architecture()["collections"] == {"weighted": True}
    assert MANAGED.architecture()["collections"]["managed_collision"]["input_hash_size"] == 1000


def test_a_version_of_another_weighting_is_another_architecture(tmp_path: Path) -> None:
    source = tmp_path / "w.pt"
    torch.save(build_module(WEIGHTED, seed=0).state_dict(), source)
    versions = ModelVersions.create(tmp_path / "versions")
    meta = import_state_dict(WEIGHTED, source, versions, promote=True)
    path = versions.path(meta.model_version)
    check_architecture(WEIGHTED, load_module_meta(path), path)
    with pytest.raises(ModelConfigError, match=r"its collections differ"):
        check_architecture(dataclasses.replace(WEIGHTED, weighted=False), meta, path)


class _Holder(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner


def _ebc(weighted: bool = False) -> EmbeddingBagCollection:
    config = EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=5, feature_names=["a"])
    return EmbeddingBagCollection(tables=[config], is_weighted=weighted)


def _managed_ec() -> ManagedCollisionEmbeddingCollection:
    configs = [EmbeddingConfig(name="t", embedding_dim=4, num_embeddings=5, feature_names=["a"])]
    remapper = MCHManagedCollisionModule(
        zch_size=5,
        device=torch.device("cpu"),
        eviction_policy=LFU_EvictionPolicy(),
        eviction_interval=1,
    )
    return ManagedCollisionEmbeddingCollection(
        EmbeddingCollection(tables=configs), ManagedCollisionCollection({"t": remapper}, configs)
    )


@pytest.mark.parametrize(
    ("inner", "says"),
    [
        (
            FeatureProcessedEmbeddingBagCollection(
                _ebc(weighted=True), {"a": PositionWeightedModule(max_feature_length=3)}
            ),
            "a FeatureProcessedEmbeddingBagCollection (its feature processors make the weights",
        ),
        (_managed_ec(), "a managed-collision EmbeddingCollection"),
        (nn.Linear(2, 2), "holds no EmbeddingBagCollection or EmbeddingCollection"),
    ],
)
def test_embedding_modules_the_contract_does_not_serve_are_refused(
    inner: nn.Module, says: str
) -> None:
    with pytest.raises(ModelConfigError) as error:
        collections(_Holder(inner))
    assert says in str(error.value) and "\n" not in str(error.value)


def test_a_weighted_collection_the_config_does_not_declare_is_one_line() -> None:
    check_collections(WEIGHTED, _Holder(_ebc(weighted=True)))
    with pytest.raises(ModelConfigError) as error:
        check_collections(DEEPFM, _Holder(_ebc(weighted=True)))
    assert str(error.value) == (
        "model.module: inner is a weighted EmbeddingBagCollection: set model.module.weighted "
        "= true (and each weighted key's weights)"
    )


def test_a_module_with_both_collections_is_read_whole() -> None:
    found = collections(_Holder(nn.ModuleList([_ebc(), EmbeddingCollection(tables=[])])))
    assert [type(c).__name__ for _, c in found] == ["EmbeddingBagCollection", "EmbeddingCollection"]
    assert not managed_collisions(_Holder(_ebc()))
    config = ModuleConfig("m:f", tables=(TableConfig("t", 5, 4, ("a",)),))
    check_collections(config, _Holder(_ebc()))
