"""The item catalogue from the real Redis or a file, and a version's retrieval index built
from its checkpoint and that catalogue."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import redis

from model.features.spec import SparseFeature
from model.ranker import build_ranker
from model.retrieval.candidates import fill_candidates
from model.retrieval.index import IndexKind
from model.store.checkpoint import save_checkpoint
from pipeline.connectors.redis.feature_store import FeatureStoreWriter
from pipeline.models.catalogue import (
    catalogue_from_file,
    catalogue_from_redis,
    load_catalogue,
    load_retrieval_index,
)
from pipeline.settings.redis import RedisSettings
from pipeline.settings.retrieval import CatalogueSource, RetrievalSettings
from tests.model.conftest import small_spec


def _write_items(client: redis.Redis, prefix: str, ids: np.ndarray) -> None:
    writer = FeatureStoreWriter(client, prefix)
    writer.write_items(
        ids, np.zeros(ids.shape[0], np.int64), np.zeros((ids.shape[0], 5), np.float32)
    )


def test_redis_catalogue_is_every_item_key_of_the_prefix(
    redis_client: redis.Redis, redis_settings: RedisSettings
) -> None:
    prefix = redis_settings.key_prefix
    ids = np.arange(25_000, dtype=np.int64) * 7 + 3  # more than one SCAN page
    _write_items(redis_client, prefix, ids)
    writer = FeatureStoreWriter(redis_client, prefix)
    writer.write_users(np.array([1, 2], np.int64), np.zeros((2, 4), np.float32), [[], []])
    _write_items(redis_client, prefix + "x", np.array([999_999], np.int64))  # another prefix
    redis_client.set(f"{prefix}:i:not-a-number", b"")
    got = catalogue_from_redis(redis_client, prefix)
    np.testing.assert_array_equal(got, ids)
    assert load_catalogue(RetrievalSettings(), redis_client, prefix).shape == (25_000,)
    assert catalogue_from_redis(redis_client, prefix + "-none").shape == (0,)


def test_file_catalogues(tmp_path: Path) -> None:
    text = tmp_path / "items.txt"
    text.write_text("# items\n42\n\n7  # seven\n42\n")
    np.testing.assert_array_equal(catalogue_from_file(text), [7, 42])
    npy = tmp_path / "items.npy"
    np.save(npy, np.array([5, 3, 5], np.int32))
    np.testing.assert_array_equal(catalogue_from_file(npy), [3, 5])
    settings = RetrievalSettings(catalogue=CatalogueSource.FILE, catalogue_path=npy)
    np.testing.assert_array_equal(load_catalogue(settings, None, "sr"), [3, 5])
    text.write_text("12\nabc\n")
    with pytest.raises(ValueError, match=r"items\.txt:2"):
        catalogue_from_file(text)
    np.save(npy, np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match="1-d integer"):
        catalogue_from_file(npy)


def test_settings_validation() -> None:
    with pytest.raises(ValueError, match="catalogue_path"):
        RetrievalSettings(catalogue=CatalogueSource.FILE)
    with pytest.raises(ValueError, match="nprobe"):
        RetrievalSettings(nprobe=0)
    with pytest.raises(ValueError, match="query_features"):
        RetrievalSettings.model_validate({"query_features": ["item_id"]})
    with pytest.raises(ValueError):
        RetrievalSettings(bogus=1)  # type: ignore[call-arg]
    values = {"query_features": ["user_id", "country"], "index": "ivfpq"}
    config = RetrievalSettings.model_validate(values).config
    assert config.query_features == (SparseFeature.USER_ID, SparseFeature.COUNTRY)
    assert config.index is IndexKind.IVFPQ
    with pytest.raises(ValueError, match="needs a Redis client"):
        load_catalogue(RetrievalSettings(), None, "sr")


def test_a_version_index_from_its_checkpoint_and_the_redis_catalogue(
    tmp_path: Path, redis_client: redis.Redis, redis_settings: RedisSettings
) -> None:
    spec = small_spec()
    checkpoint = tmp_path / "v1"
    save_checkpoint(build_ranker(spec, seed=9), spec, checkpoint, model_version="v1")
    ids = np.arange(300, dtype=np.int64) * 13 + 1
    _write_items(redis_client, redis_settings.key_prefix, ids)
    settings = RetrievalSettings(num_candidates=25)
    catalogue = load_catalogue(settings, redis_client, redis_settings.key_prefix)
    index = load_retrieval_index(checkpoint, settings.config, catalogue)
    assert (index.model_version, index.kind, index.num_items) == ("v1", IndexKind.FLAT, 300)

    class Events:
        user_ids = np.array([5, 6], np.int64)
        device_ids = country_ids = np.zeros(2, np.int64)
        recent_counts = np.zeros(2, np.int64)
        recent_ids = np.zeros(0, np.int64)
        candidate_counts = np.array([0, 1], np.int64)
        candidate_ids = np.array([77], np.int64)

    found = fill_candidates(Events(), index)
    assert found.candidate_counts.tolist() == [25, 1]
    assert set(found.candidate_ids[:25].tolist()) <= set(ids.tolist())
    assert found.retrieved.tolist() == [True, False]
