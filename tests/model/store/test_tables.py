"""Embedding tables read from checkpoints of both formats equal the ranker's own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from model.distributed import save_sharded
from model.features.spec import FeatureSpec, SparseFeature
from model.ranker import Ranker, build_ranker
from model.store.checkpoint import save_checkpoint
from model.store.tables import EmbeddingTables, table_state_key

FEATURES = (SparseFeature.ITEM_ID, SparseFeature.USER_ID, SparseFeature.RECENT_ITEMS)


@pytest.fixture(scope="module")
def ranker(spec: FeatureSpec) -> Ranker:
    return build_ranker(spec, seed=5)


def test_state_key_names_the_ranker_weight(ranker: Ranker, spec: FeatureSpec) -> None:
    assert table_state_key(spec, SparseFeature.ITEM_ID) in ranker.state_dict()


@pytest.mark.parametrize("fmt", ["torch", "dcp"])
def test_checkpoint_tables_equal_the_ranker_tables(
    tmp_path: Path, ranker: Ranker, spec: FeatureSpec, fmt: str
) -> None:
    path = tmp_path / "ckpt"
    if fmt == "torch":
        save_checkpoint(ranker, spec, path, model_version="m1")
    else:
        save_sharded(ranker, spec, path, model_version="m1")
    read = EmbeddingTables.from_checkpoint(path, FEATURES)
    own = EmbeddingTables.from_ranker(ranker, FEATURES, model_version="m1")
    assert read.model_version == "m1" and read.spec == spec
    for feature in FEATURES:
        assert read.tables[feature].shape == (spec.table(feature).num_embeddings, 16)
        np.testing.assert_array_equal(read.tables[feature], own.tables[feature])
    assert set(read.tables) == set(FEATURES)


def test_rows_hash_raw_ids_like_the_ranker(ranker: Ranker, spec: FeatureSpec) -> None:
    tables = EmbeddingTables.from_ranker(ranker, [SparseFeature.ITEM_ID])
    raw = np.array([5 * 10**12, 17, 2**62], dtype=np.int64)
    rows = spec.hash_ids(SparseFeature.ITEM_ID, raw)
    got = tables.rows(SparseFeature.ITEM_ID, raw)
    np.testing.assert_array_equal(got, tables.tables[SparseFeature.ITEM_ID][rows])
    assert got.flags.c_contiguous and got.dtype == np.float32


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        EmbeddingTables.from_checkpoint(tmp_path / "none", FEATURES)


def test_a_checkpoint_of_another_shape_is_refused(
    tmp_path: Path, ranker: Ranker, spec: FeatureSpec
) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(ranker, spec, path)
    weights = path / "model.pt"
    state = torch.load(weights, weights_only=True)
    state[table_state_key(spec, SparseFeature.ITEM_ID)] = torch.zeros(3, 16)
    torch.save(state, weights)
    with pytest.raises(ValueError, match="t_item_id"):
        EmbeddingTables.from_checkpoint(path, FEATURES)
