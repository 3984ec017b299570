"""One loader for start-up and the watcher: a version's scorer and its retrieval index from the
same checkpoint; incompatible or corrupt versions refused before anything collective."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest

from model.rank import RankContext
from model.ranker import build_ranker
from model.store.checkpoint import save_checkpoint
from pipeline.models.loader import IncompatibleModel, ModelLoader, serving_options
from pipeline.settings.codec import CodecSettings
from pipeline.settings.loading import Settings
from pipeline.settings.model import ModelSettings
from pipeline.settings.retrieval import CatalogueSource, RetrievalSettings
from tests.pipeline.factories import TINY_SPEC


def _checkpoint(path: Path, seed: int = 0, **spec_changes: object) -> Path:
    spec = dataclasses.replace(TINY_SPEC, **spec_changes)  # type: ignore[arg-type]
    save_checkpoint(build_ranker(spec, seed=seed), spec, path, model_version=path.name)
    return path


def _settings(tmp_path: Path, items: list[int] | None = None, **retrieval: object) -> Settings:
    catalogue = tmp_path / "items.txt"
    catalogue.write_text("".join(f"{i}\n" for i in (items if items is not None else range(40))))
    return Settings(
        model=ModelSettings(checkpoint=tmp_path / "unused", device="cpu"),
        codec=CodecSettings(max_candidates=50),
        retrieval=RetrievalSettings(
            catalogue=CatalogueSource.FILE,
            catalogue_path=catalogue,
            **retrieval,  # type: ignore[arg-type]
        ),
    )


def test_a_version_loads_with_the_index_of_its_own_item_vectors(tmp_path: Path) -> None:
    loader = ModelLoader(_settings(tmp_path, num_candidates=80))
    first = loader.load(_checkpoint(tmp_path / "m-1", seed=0))
    second = loader.load(_checkpoint(tmp_path / "m-2", seed=1))
    for served, name in ((first, "m-1"), (second, "m-2")):
        assert served.version == name
        assert served.index is not None and served.index.model_version == name
        assert served.index.num_items == 40
    vectors = [s.index.tables.tables for s in (first, second) if s.index is not None]
    assert not np.array_equal(*(v[next(iter(v))] for v in vectors))  # each its own weights
    options = serving_options(loader.settings, checkpoint=tmp_path / "m-1")
    assert options.max_event_rows == 80  # a retrieved event fits
    assert first.options == options  # the options its scorer was built with, handed on
    assert second.options == dataclasses.replace(options, checkpoint=tmp_path / "m-2")


def test_no_index_without_retrieval_or_items(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _checkpoint(tmp_path / "m-1")
    assert ModelLoader(_settings(tmp_path, enabled=False)).load(path).index is None
    with caplog.at_level(logging.WARNING, logger="pipeline.models.loader"):
        assert ModelLoader(_settings(tmp_path, items=[])).load(path).index is None
    assert "catalogue (file) is empty" in caplog.text


def test_a_version_with_other_features_is_refused(tmp_path: Path) -> None:
    loader = ModelLoader(_settings(tmp_path, enabled=False))
    loader.load(_checkpoint(tmp_path / "m-1"))
    loader.load_local(_checkpoint(tmp_path / "m-2", seed=3, over_arch=(8, 1)))  # fine
    with pytest.raises(IncompatibleModel, match="recent_items_cap 4 -> 9"):
        loader.load_local(_checkpoint(tmp_path / "m-3", recent_items_cap=9))


def test_a_rank_checks_the_weights_alone_and_builds_nothing(tmp_path: Path) -> None:
    rank = RankContext(rank=1, world_size=2, local_rank=1, local_world_size=2)
    loader = ModelLoader(_settings(tmp_path, enabled=False), rank)
    good = loader.load_local(_checkpoint(tmp_path / "m-1"))
    assert good.scorer is None and good.version == "m-1"  # built collectively later
    assert good.options is None  # made with the scorer, by complete()
    corrupt = _checkpoint(tmp_path / "m-2", seed=5)
    weights = corrupt / "model.pt"
    data = bytearray(weights.read_bytes())
    data[-200] ^= 0xFF  # one flipped byte: the digest no longer matches
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        loader.load_local(corrupt)
