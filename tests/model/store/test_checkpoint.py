"""Tests for model.checkpoint: round trip, metadata, atomic overwrite and load errors."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from model.features.build import FeatureColumns, build_model_input
from model.features.spec import FeatureSpec
from model.ranker import Ranker, build_ranker
from model.store.checkpoint import (
    META_FILE,
    WEIGHTS_FILE,
    load_checkpoint,
    load_meta,
    load_spec,
    load_state_dict,
    save_checkpoint,
    weights_digest,
)
from tests.support.foreign_checkpoint import CreatesFile, payload_runs


@pytest.fixture()
def ranker(spec: FeatureSpec) -> Ranker:
    return build_ranker(spec, seed=42)


def test_round_trip_gives_identical_scores(
    tmp_path: Path, ranker: Ranker, spec: FeatureSpec, cols: FeatureColumns
) -> None:
    path = tmp_path / "ckpt"
    saved = save_checkpoint(ranker, spec, path, metrics={"auc": 0.81})
    loaded, meta = load_checkpoint(path)
    assert meta == saved
    assert meta.spec == spec
    assert meta.metrics == {"auc": 0.81}
    assert "torch" in meta.framework_versions and "torchrec" in meta.framework_versions
    assert not loaded.training
    inp = build_model_input(cols, spec)
    assert torch.equal(loaded.score(inp), ranker.score(inp))
    assert sorted(p.name for p in path.iterdir()) == [META_FILE, WEIGHTS_FILE]
    assert load_spec(path) == spec
    assert set(load_state_dict(path)) == set(ranker.state_dict())


def test_default_model_version_is_content_hash(
    tmp_path: Path, ranker: Ranker, spec: FeatureSpec
) -> None:
    a = save_checkpoint(ranker, spec, tmp_path / "a")
    b = save_checkpoint(ranker, spec, tmp_path / "b")
    assert re.fullmatch(r"dlrm-\d{8}-[0-9a-f]{8}", a.model_version)
    assert a.model_version == b.model_version
    assert a.weights_sha256 == weights_digest(ranker.state_dict())
    other = save_checkpoint(build_ranker(spec, seed=43), spec, tmp_path / "c")
    assert other.model_version != a.model_version
    named = save_checkpoint(ranker, spec, tmp_path / "d", model_version="v7")
    assert load_meta(tmp_path / "d").model_version == named.model_version == "v7"
    data = json.loads((tmp_path / "a" / META_FILE).read_text())
    assert data["spec"]["tables"][0]["name"] == "t_user_id"
    assert data["created_at"].endswith("Z")


def test_existing_path_needs_overwrite(tmp_path: Path, ranker: Ranker, spec: FeatureSpec) -> None:
    path = tmp_path / "ckpt"
    save_checkpoint(ranker, spec, path)
    with pytest.raises(FileExistsError):
        save_checkpoint(ranker, spec, path)
    other = build_ranker(spec, seed=1)
    meta = save_checkpoint(other, spec, path, overwrite=True)
    assert load_meta(path).model_version == meta.model_version
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temporary leftovers


def test_save_rejects_wrong_spec_and_meta_weights(
    tmp_path: Path, ranker: Ranker, spec: FeatureSpec
) -> None:
    with pytest.raises(ValueError, match="spec"):
        save_checkpoint(ranker, dataclasses.replace(spec, hash_salt=1), tmp_path / "x")
    with pytest.raises(ValueError, match="meta"):
        save_checkpoint(build_ranker(spec, embedding_device="meta"), spec, tmp_path / "y")
    assert list(tmp_path.iterdir()) == []


def test_load_errors(tmp_path: Path, ranker: Ranker, spec: FeatureSpec) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_checkpoint(tmp_path / "nowhere")

    path = tmp_path / "ckpt"
    save_checkpoint(ranker, spec, path)
    weights = (path / WEIGHTS_FILE).read_bytes()
    meta_text = (path / META_FILE).read_text()

    (path / WEIGHTS_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=WEIGHTS_FILE):
        load_checkpoint(path)

    (path / WEIGHTS_FILE).write_bytes(weights[: len(weights) // 2])
    with pytest.raises(ValueError, match="corrupt checkpoint weights"):
        load_checkpoint(path)

    (path / WEIGHTS_FILE).write_bytes(weights)
    (path / META_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="corrupt checkpoint metadata"):
        load_checkpoint(path)
    with pytest.raises(ValueError, match="corrupt checkpoint metadata"):
        load_spec(path)

    (path / META_FILE).unlink()
    with pytest.raises(FileNotFoundError, match=META_FILE):
        load_checkpoint(path)

    data = json.loads(meta_text)
    data["spec"]["tables"][0]["num_embeddings"] += 1
    data["weights_sha256"] = ""  # skip the digest check to reach the shape check
    (path / META_FILE).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="does not fit"):
        load_checkpoint(path)

    data = json.loads(meta_text)
    data["weights_sha256"] = "0" * 64
    (path / META_FILE).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="digest"):
        load_checkpoint(path)

    data = json.loads(meta_text)
    del data["model_version"]
    (path / META_FILE).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="model_version"):
        load_meta(path)


def test_weights_that_would_run_code_are_refused_and_never_run(
    tmp_path: Path, ranker: Ranker, spec: FeatureSpec
) -> None:
    """``model.pt`` is read with ``torch.load(weights_only=True)``: a pickled object whose
    loading creates a file is refused, and the file never appears."""
    path = tmp_path / "ckpt"
    save_checkpoint(ranker, spec, path)
    marker = tmp_path / "payload-ran"
    torch.save({"weight": CreatesFile(marker)}, path / WEIGHTS_FILE)
    with pytest.raises(ValueError, match="corrupt checkpoint weights"):
        load_checkpoint(path)
    assert not marker.exists()
    assert payload_runs(tmp_path)  # the same payload, unpickled plainly, does run
