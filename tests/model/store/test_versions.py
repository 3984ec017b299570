"""Versions directories: write, list, promote, resolve; the pointer's atomicity and lock."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from model.distributed import save_sharded
from model.features.spec import FeatureSpec
from model.ranker import Ranker, build_ranker
from model.store.checkpoint import load_checkpoint, load_meta, save_checkpoint
from model.store.versions import (
    POINTER_FILE,
    ModelVersions,
    NoCurrentVersionError,
    UnknownVersionError,
    is_versions_dir,
    resolve_checkpoint,
    validate_version_name,
)


@pytest.fixture(scope="module")
def rankers(spec: FeatureSpec) -> tuple[Ranker, Ranker]:
    return build_ranker(spec, seed=1), build_ranker(spec, seed=2)


def _weights_equal(a: Ranker, b: Ranker) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_new_versions_directory_has_nothing_current(tmp_path: Path) -> None:
    versions = ModelVersions.create(tmp_path / "models")
    assert is_versions_dir(versions.root)
    assert versions.current() is None
    assert versions.pointer().generation == 0
    assert versions.list_versions() == []
    with pytest.raises(NoCurrentVersionError, match="model promote"):
        resolve_checkpoint(versions.root)


def test_write_promote_and_resolve(
    tmp_path: Path, spec: FeatureSpec, rankers: tuple[Ranker, Ranker]
) -> None:
    versions = ModelVersions.create(tmp_path / "models")
    meta = versions.write(rankers[0], spec, version="v1", metrics={"auc": 0.7}, promote=True)
    assert meta.model_version == "v1"
    assert versions.current() == "v1"
    assert versions.pointer().generation == 1
    served = resolve_checkpoint(versions.root)
    assert served == versions.root / "v1"
    ranker, loaded = load_checkpoint(served)
    assert loaded.model_version == "v1"
    assert _weights_equal(ranker, rankers[0])

    versions.write(rankers[1], spec, version="v2")
    assert versions.current() == "v1"  # written, not promoted
    listed = {info.version: info for info in versions.list_versions()}
    assert set(listed) == {"v1", "v2"}
    assert listed["v1"].current and not listed["v2"].current
    assert listed["v1"].complete and listed["v1"].weights_format == "torch"
    assert listed["v1"].metrics == {"auc": 0.7}

    pointer = versions.promote("v2")
    assert (pointer.version, pointer.generation, pointer.previous) == ("v2", 2, "v1")
    assert _weights_equal(load_checkpoint(resolve_checkpoint(versions.root))[0], rankers[1])
    back = versions.promote("v1")  # roll back
    assert (back.version, back.generation, back.previous) == ("v1", 3, "v2")


def test_default_version_name_is_the_checkpoint_model_version(
    tmp_path: Path, spec: FeatureSpec, rankers: tuple[Ranker, Ranker]
) -> None:
    versions = ModelVersions.create(tmp_path / "models")
    meta = versions.write(rankers[0], spec)
    assert (versions.root / meta.model_version).is_dir()
    assert meta.model_version.startswith("dlrm-")
    with pytest.raises(FileExistsError, match="already exists"):
        versions.write(rankers[0], spec)  # same weights, same default name
    assert not [p for p in versions.root.iterdir() if p.name.startswith(".incoming")]


def test_promoting_again_bumps_the_generation(
    tmp_path: Path, spec: FeatureSpec, rankers: tuple[Ranker, Ranker]
) -> None:
    versions = ModelVersions.create(tmp_path / "models")
    versions.write(rankers[0], spec, version="v1", promote=True)
    again = versions.promote("v1")
    assert (again.version, again.generation, again.previous) == ("v1", 2, None)


def test_unknown_and_incomplete_versions_are_refused(
    tmp_path: Path, spec: FeatureSpec, rankers: tuple[Ranker, Ranker]
) -> None:
    versions = ModelVersions.create(tmp_path / "models")
    versions.write(rankers[0], spec, version="v1", promote=True)
    with pytest.raises(UnknownVersionError, match=r"'v9'.*known: v1"):
        versions.promote("v9")
    half = versions.root / "v3"
    half.mkdir()
    (half / "meta.json").write_text(json.dumps({"model_version": "v3"}))
    with pytest.raises(ValueError, match="incomplete"):
        versions.promote("v3")
    assert not {i.version: i for i in versions.list_versions()}["v3"].complete
    assert versions.current() == "v1"
    with pytest.raises(ValueError, match="bad version name"):
        versions.promote("../v1")


def test_overwrite_never_replaces_the_current_version(
    tmp_path: Path, spec: FeatureSpec, rankers: tuple[Ranker, Ranker]
) -> None:
    versions = ModelVersions.create(tmp_path / "models")
    versions.write(rankers[0], spec, version="v1", promote=True)
    versions.write(rankers[0], spec, version="v2")
    with pytest.raises(FileExistsError, match="current version"):
        versions.write(rankers[1], spec, version="v1", overwrite=True)
    versions.write(rankers[1], spec, version="v2", overwrite=True)
    assert _weights_equal(load_checkpoint(versions.path("v2"))[0], rankers[1])
    assert _weights_equal(load_checkpoint(versions.path("v1"))[0], rankers[0])


def test_a_plain_checkpoint_is_served_as_before(
    tmp_path: Path, spec: FeatureSpec, rankers: tuple[Ranker, Ranker]
) -> None:
    plain = tmp_path / "ckpt"
    save_checkpoint(rankers[0], spec, plain)
    assert resolve_checkpoint(plain) == plain
    assert not is_versions_dir(plain)
    with pytest.raises(FileNotFoundError, match="not a versions directory"):
        ModelVersions(plain)
    with pytest.raises(FileExistsError, match="plain checkpoint"):
        ModelVersions.create(plain)
    with pytest.raises(FileNotFoundError, match="neither"):
        resolve_checkpoint(tmp_path / "nothing")


def test_add_copies_a_checkpoint_in_under_its_name(
    tmp_path: Path, spec: FeatureSpec, rankers: tuple[Ranker, Ranker]
) -> None:
    source = tmp_path / "trained-elsewhere"
    meta = save_checkpoint(rankers[1], spec, source)
    versions = ModelVersions.create(tmp_path / "models")
    assert versions.add(source) == meta.model_version
    assert versions.add(source, version="renamed", promote=True) == "renamed"
    assert load_meta(resolve_checkpoint(versions.root)).model_version == "renamed"
    assert load_meta(source).model_version == meta.model_version  # the source is untouched
    ranker, _ = load_checkpoint(versions.path("renamed"))  # the digest still verifies
    assert _weights_equal(ranker, rankers[1])


def test_a_sharded_checkpoint_can_be_a_version(
    tmp_path: Path, spec: FeatureSpec, rankers: tuple[Ranker, Ranker]
) -> None:
    versions = ModelVersions.create(tmp_path / "models")
    save_sharded(rankers[0], spec, versions.path("sharded-1"), model_version="sharded-1")
    info = versions.list_versions()[0]
    assert (info.version, info.weights_format, info.complete) == ("sharded-1", "dcp", True)
    versions.promote("sharded-1")
    assert resolve_checkpoint(versions.root) == versions.path("sharded-1")


def test_corrupt_pointer_is_an_error(tmp_path: Path) -> None:
    versions = ModelVersions.create(tmp_path / "models")
    (versions.root / POINTER_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="corrupt version pointer"):
        versions.pointer()


def test_concurrent_promotions_are_serialised(
    tmp_path: Path, spec: FeatureSpec, rankers: tuple[Ranker, Ranker]
) -> None:
    versions = ModelVersions.create(tmp_path / "models")
    versions.write(rankers[0], spec, version="a")
    versions.write(rankers[1], spec, version="b")
    seen: list[int] = []
    lock = threading.Lock()

    def promote_many(name: str) -> None:
        mine = ModelVersions(versions.root)  # own handle, like another process
        for _ in range(10):
            generation = mine.promote(name).generation
            with lock:
                seen.append(generation)

    threads = [threading.Thread(target=promote_many, args=(n,)) for n in "abab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 41))  # no generation lost or repeated
    assert versions.pointer().generation == 40
    leftovers = [p.name for p in versions.root.iterdir() if p.name.startswith(".current")]
    assert leftovers == []


def test_version_names() -> None:
    assert validate_version_name("dlrm-20250101-1a2b3c4d") == "dlrm-20250101-1a2b3c4d"
    for bad in ("", ".hidden", "a/b", "x" * 129, POINTER_FILE, "-dash"):
        with pytest.raises(ValueError):
            validate_version_name(bad)
