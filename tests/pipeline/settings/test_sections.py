"""Sections whose keys are a :mod:`model` dataclass's fields (:func:`keys_of`): one declaration
of each key, its type and default, and the one object the settings build from it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from model.distributed.config import ShardingConfig, ShardingKind, TableShardingConfig
from model.features.spec import SparseFeature
from model.retrieval.config import IndexKind, RetrievalConfig
from pipeline.settings.loading import load_settings
from pipeline.settings.model import ShardingSettings, TableShardingSettings
from pipeline.settings.retrieval import RetrievalSettings


def test_retrieval_keys_are_retrieval_configs_fields_with_its_defaults() -> None:
    fields = {f.name: f.default for f in dataclasses.fields(RetrievalConfig) if f.name != "seed"}
    section = RetrievalSettings()
    for name, default in fields.items():
        assert name in RetrievalSettings.model_fields, name
        assert getattr(section, name) == default, name
    assert section.config == RetrievalConfig()
    assert "seed" not in RetrievalSettings.model_fields  # not a setting


def test_retrieval_settings_build_their_config_once_from_file_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "streamrank.toml"
    path.write_text('[retrieval]\nnum_candidates = 7\nindex = "ivfpq"\nnprobe = 3\n')
    monkeypatch.setenv("STREAMRANK_RETRIEVAL__NPROBE", "5")
    monkeypatch.setenv("STREAMRANK_RETRIEVAL__QUERY_FEATURES", '["user_id", "device"]')
    config = load_settings(path).retrieval.config
    assert config == RetrievalConfig(
        num_candidates=7,
        index=IndexKind.IVFPQ,
        nprobe=5,
        query_features=(SparseFeature.USER_ID, SparseFeature.DEVICE),
    )


def test_retrieval_configs_own_checks_refuse_a_bad_value_naming_the_key() -> None:
    with pytest.raises(ValidationError, match="num_candidates must be >= 1"):
        RetrievalSettings(num_candidates=0)
    with pytest.raises(ValidationError, match="seed"):
        RetrievalSettings.model_validate({"seed": 3})


def test_table_sharding_keys_are_table_sharding_configs_fields_and_built_once() -> None:
    names = [f.name for f in dataclasses.fields(TableShardingConfig)]
    assert list(TableShardingSettings.model_fields) == names
    sharding = ShardingSettings.model_validate(
        {"default": "row_wise", "tables": {"item_id": {"sharding_type": "column_wise"}}}
    )
    assert sharding.config == ShardingConfig(
        default=TableShardingConfig(ShardingKind.ROW_WISE),
        per_table={"item_id": TableShardingConfig(ShardingKind.COLUMN_WISE)},
    )
    assert sharding.config is sharding.config  # made once, when read
    with pytest.raises(ValidationError, match="explicit ranks are not supported for row_wise"):
        TableShardingSettings.model_validate({"sharding_type": "row_wise", "ranks": [0, 1]})


def test_a_copy_with_changes_is_validated_and_builds_its_own_config() -> None:
    section = RetrievalSettings(num_candidates=7)
    copied = section.model_copy(update={"num_candidates": 9})
    assert copied.config == RetrievalConfig(num_candidates=9)  # not the original's
    assert section.config == RetrievalConfig(num_candidates=7)
    assert section.model_copy().config is section.config  # nothing changed: nothing built
    with pytest.raises(ValidationError, match="num_candidates must be >= 1"):
        section.model_copy(update={"num_candidates": 0})
    with pytest.raises(ValidationError, match="no_such_key"):
        section.model_copy(update={"no_such_key": 1})
