"""A configured module's weights: a plain state_dict file imported as a version (prefix stripped,
keys and shapes checked in one line), loaded strictly, its architecture kept with it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torchrec.models.dlrm import DLRMTrain

from model.module.factory import build_module
from model.module.store import (
    check_architecture,
    import_state_dict,
    is_module_version,
    load_module_meta,
    load_module_weights,
)
from model.module.types import ModelConfigError, TableConfig
from model.module.weights import read_state_dict
from model.store.versions import ModelVersions
from tests.model.module.configs import DCN, DEEPFM


def _saved(tmp_path: Path, state: dict[str, torch.Tensor], name: str = "w.pt") -> Path:
    path = tmp_path / name
    torch.save(state, path)
    return path


def test_a_state_dict_file_becomes_a_version_that_loads_strictly(tmp_path: Path) -> None:
    trained = build_module(DEEPFM, seed=3)
    source = _saved(tmp_path, trained.state_dict())
    versions = ModelVersions.create(tmp_path / "versions")
    meta = import_state_dict(DEEPFM, source, versions, promote=True, metrics={"auc": 0.7})
    assert versions.current() == meta.model_version
    assert meta.model_version.startswith("simpledeepfmnn-")
    assert meta.architecture == DEEPFM.architecture() and meta.metrics == {"auc": 0.7}
    path = versions.current_path()
    assert is_module_version(path)
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "model.pt"]
    fresh = build_module(DEEPFM, seed=9)
    assert load_module_meta(path) == load_module_weights(fresh, path)
    for key, value in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_dlrm_trains_keys_are_stripped_of_their_prefix(tmp_path: Path) -> None:
    dcn = build_module(DCN, seed=1)
    wrapped = DLRMTrain(dcn)  # TorchRec's training wrapper keeps the model under "model."
    source = _saved(tmp_path, wrapped.state_dict())
    versions = ModelVersions.create(tmp_path / "v")
    with pytest.raises(ModelConfigError) as error:
        import_state_dict(DCN, source, versions)
    assert "set model.module.state_dict_prefix = 'model.'" in str(error.value)
    meta = import_state_dict(DCN, source, versions, version="dcn-1", strip_prefix="model.")
    assert meta.model_version == "dcn-1"
    assert set(read_state_dict(versions.path("dcn-1") / "model.pt")) == set(dcn.state_dict())


def test_keys_or_shapes_that_do_not_fit_are_one_line(tmp_path: Path) -> None:
    versions = ModelVersions.create(tmp_path / "v")
    state = build_module(DEEPFM).state_dict()
    missing = dict(state)
    missing.pop("over_arch.model.0.bias")
    with pytest.raises(ModelConfigError) as error:
        import_state_dict(DEEPFM, _saved(tmp_path, missing), versions)
    assert "missing keys over_arch.model.0.bias, unexpected keys none" in str(error.value)
    other = build_module(
        dataclasses.replace(
            DEEPFM, tables=(TableConfig("t_user", 51, 8, ("user",)), *DEEPFM.tables[1:])
        )
    )
    with pytest.raises(ModelConfigError) as error:
        import_state_dict(DEEPFM, _saved(tmp_path, other.state_dict()), versions)
    text = str(error.value)
    assert "embedding_bags.t_user.weight is [51, 8], the module's is [50, 8]" in text
    assert "\n" not in text and not versions.list_versions()


def test_files_that_are_not_state_dicts_are_refused(tmp_path: Path) -> None:
    versions = ModelVersions.create(tmp_path / "v")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(ModelConfigError, match=r"is not a state_dict file torch\.load"):
        import_state_dict(DEEPFM, garbage, versions)
    with pytest.raises(ModelConfigError, match="does not hold a state_dict"):
        import_state_dict(DEEPFM, _saved(tmp_path, [torch.zeros(1)]), versions)  # type: ignore[arg-type]
    with pytest.raises(ModelConfigError, match="state_dict file not found"):
        import_state_dict(DEEPFM, tmp_path / "nope.pt", versions)


def test_a_version_of_another_architecture_is_named_as_such(tmp_path: Path) -> None:
    versions = ModelVersions.create(tmp_path / "v")
    meta = import_state_dict(DEEPFM, _saved(tmp_path, build_module(DEEPFM).state_dict()), versions)
    other = dataclasses.replace(DEEPFM, kwargs={**DEEPFM.kwargs, "hidden_layer_size": 8})
    with pytest.raises(ModelConfigError) as error:
        check_architecture(other, meta, versions.path(meta.model_version))
    assert "was imported for another module (its kwargs differ" in str(error.value)
    check_architecture(DEEPFM, meta, versions.path(meta.model_version))


def test_corrupt_weights_fail_their_digest(tmp_path: Path) -> None:
    versions = ModelVersions.create(tmp_path / "v")
    meta = import_state_dict(DEEPFM, _saved(tmp_path, build_module(DEEPFM).state_dict()), versions)
    path = versions.path(meta.model_version)
    data = json.loads((path / "meta.json").read_text())
    data["weights_sha256"] = "0" * 64
    (path / "meta.json").write_text(json.dumps(data))
    with pytest.raises(ModelConfigError, match=r"do not match meta\.json.s digest"):
        load_module_weights(build_module(DEEPFM), path)
