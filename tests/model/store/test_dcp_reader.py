"""model.store.dcp_reader: a sharded checkpoint's index is read with DCP's own classes only.

Every reader of a sharded checkpoint (the plain and the sharded load, the retrieval tables,
``model import``) refuses an index that would run code, and the payload never runs: the
marker file it would create never appears. A checkpoint DCP wrote still loads.
"""

from __future__ import annotations

import io
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

from model.distributed.checkpoint import load_ranker, save_sharded
from model.features.spec import FeatureSpec, SparseFeature
from model.ranker import build_ranker
from model.store.dcp_reader import (
    DCP_INDEX_FILE,
    TensorsOnlyLoadPlanner,
    UnsafeCheckpoint,
    load_dcp,
    read_dcp_index,
)
from model.store.tables import EmbeddingTables, table_state_key
from model.store.versions import ModelVersions
from tests.support.foreign_checkpoint import hide_in_real_index, payload_runs, write_foreign_index


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory, spec: FeatureSpec) -> Path:
    """A sharded checkpoint written by DCP (one process)."""
    path = tmp_path_factory.mktemp("dcp") / "ckpt"
    save_sharded(build_ranker(spec, seed=3), spec, path)
    return path


@pytest.fixture
def copy_of(sharded: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(sharded, dest)
    return dest


def test_the_payload_is_real(tmp_path: Path) -> None:
    assert payload_runs(tmp_path)  # plain pickle, as DCP's own reader, runs it


def test_a_checkpoint_dcp_wrote_loads(sharded: Path, spec: FeatureSpec) -> None:
    index = read_dcp_index(sharded)
    reference = build_ranker(spec, seed=3)
    assert set(index.state_dict_metadata) == set(reference.state_dict())
    ranker, _ = load_ranker(sharded)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(ranker.state_dict()[name], tensor), name
    tables = EmbeddingTables.from_checkpoint(sharded, [SparseFeature.ITEM_ID])
    item_key = table_state_key(spec, SparseFeature.ITEM_ID)
    assert torch.equal(
        torch.from_numpy(tables.tables[SparseFeature.ITEM_ID]), reference.state_dict()[item_key]
    )


@pytest.mark.parametrize("plant", [write_foreign_index, hide_in_real_index])
def test_every_reader_refuses_an_index_that_runs_code(
    plant: object, copy_of: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "payload-ran"
    plant(copy_of, marker)  # type: ignore[operator]
    with pytest.raises(UnsafeCheckpoint, match="which a DCP index never holds"):
        read_dcp_index(copy_of)
    with pytest.raises(ValueError, match="refused sharded checkpoint index"):
        load_ranker(copy_of)
    with pytest.raises(ValueError, match="refused sharded checkpoint index"):
        EmbeddingTables.from_checkpoint(copy_of, [SparseFeature.ITEM_ID])
    versions = ModelVersions.create(tmp_path / "models")
    with pytest.raises(ValueError, match="refused sharded checkpoint index"):
        versions.add(copy_of, version="foreign")
    assert [v.version for v in versions.list_versions()] == []  # nothing was placed
    assert not marker.exists()


def _rewrite_index(path: Path, change: object) -> None:
    index = path / DCP_INDEX_FILE
    metadata = pickle.loads(index.read_bytes())  # written by DCP in this test
    change(metadata)  # type: ignore[operator]
    index.write_bytes(pickle.dumps(metadata))


def test_byte_items_are_refused(copy_of: Path, spec: FeatureSpec) -> None:
    key = next(iter(build_ranker(spec).state_dict()))

    def as_bytes(metadata: object) -> None:
        metadata.state_dict_metadata[key] = BytesStorageMetadata()  # type: ignore[attr-defined]

    _rewrite_index(copy_of, as_bytes)
    with pytest.raises(UnsafeCheckpoint, match="BytesStorageMetadata"):
        read_dcp_index(copy_of)


def test_shards_outside_the_directory_are_refused(copy_of: Path) -> None:
    def outside(metadata: object) -> None:
        for info in metadata.storage_data.values():  # type: ignore[attr-defined]
            info.relative_path = "../elsewhere.distcp"

    _rewrite_index(copy_of, outside)
    with pytest.raises(UnsafeCheckpoint, match="not a plain file name"):
        read_dcp_index(copy_of)


def test_a_garbled_index_is_refused(copy_of: Path) -> None:
    (copy_of / DCP_INDEX_FILE).write_bytes(b"\x80\x04not a pickle at all")
    with pytest.raises(UnsafeCheckpoint):
        load_dcp({}, copy_of)


def test_the_planner_refuses_byte_items() -> None:
    index = MetadataIndex("model.anything")
    item = ReadItem(
        type=LoadItemType.BYTE_IO,
        dest_index=index,
        dest_offsets=torch.Size([]),
        storage_index=index,
        storage_offsets=torch.Size([]),
        lengths=torch.Size([]),
    )
    with pytest.raises(UnsafeCheckpoint, match="tensors only"):
        TensorsOnlyLoadPlanner().load_bytes(item, io.BytesIO(b""))
