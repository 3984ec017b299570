"""A configured model's retrieval index, built by the model loader for each version: the rows of
its own tables (read from the version's weights) or the vectors of the items' Redis records,
searched with the user's row or the user's Redis vector; the catalogue it indexes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch

from model.module.store import import_state_dict
from model.store.versions import ModelVersions
from pipeline.connectors.redis.keys import key_ids
from pipeline.connectors.redis.vectors import read_vectors
from pipeline.models.configured_index import ConfiguredIndex
from pipeline.models.loader import ModelLoader
from pipeline.models.preflight import configured_module
from pipeline.settings.loading import Settings, load_settings
from pipeline.settings.redis import RedisSettings
from pipeline.settings.retrieval import RetrievalSettings
from tests.integration.byom import Example, make_example

BAGS = "sparse_arch.embedding_bag_collection.embedding_bags"


def _example(
    name: str, tmp: Path, prefix: str, seeds: tuple[int, ...] = (0,), **retrieval: Any
) -> tuple[Example, Settings, list[Path]]:
    """The example's model, one version per seed, with ``[retrieval]`` as given."""
    ex = make_example(name, tmp, prefix, tmp / "versions", steps=1)
    settings = load_settings(ex.toml)
    settings = settings.model_copy(update={"retrieval": RetrievalSettings(**retrieval)})
    config, _ = configured_module(settings)
    versions = ModelVersions.create(tmp / "versions")
    strip = settings.model.module.state_dict_prefix if settings.model.module else ""
    paths = []
    for seed in seeds:
        weights = tmp / f"{name}-{seed}.pt"
        ex.script.init(weights, steps=1, seed_=seed)
        meta = import_state_dict(config, weights, versions, f"v{seed}", strip_prefix=strip)
        paths.append(versions.path(meta.model_version))
    return ex, settings, paths


def _weights(path: Path, table: str) -> np.ndarray:
    return torch.load(path / "model.pt", weights_only=True)[f"{BAGS}.{table}.weight"].numpy()


def _assert_top(index: ConfiguredIndex, queries: np.ndarray, items: np.ndarray, k: int) -> None:
    """The index's ``k`` best of each query are the ``k`` largest inner products with ``items``
    (rows of the catalogue, in ``index.item_ids`` order), up to float ties."""
    ids, _ = index.search(queries, k)
    products = queries.astype(np.float64) @ items.astype(np.float64).T
    position = {int(item): i for i, item in enumerate(index.item_ids)}
    for row, found in enumerate(ids):
        kth = np.sort(products[row])[::-1][k - 1]
        assert len(set(found.tolist())) == k
        assert min(products[row, position[int(i)]] for i in found) >= kth - 1e-5


def test_each_version_indexes_its_own_rows_and_queries_with_them(tmp_path: Path) -> None:
    catalogue = tmp_path / "offers.txt"
    catalogue.write_text("".join(f"{i}\n" for i in [*range(0, 3000, 2), 2001]))
    _, settings, (first, second) = _example(
        "deepfm",
        tmp_path,
        "unit",
        seeds=(0, 1),
        query={"source": "table", "table": "t_viewer"},
        items={"source": "table", "table": "t_offer"},
        catalogue="file",
        catalogue_path=catalogue,
    )
    loader = ModelLoader(settings)
    users = np.array([3, 1003, 650, 999], dtype=np.int64)
    queries = []
    served = loader.load(first)  # start-up; then the watcher's part of a swap
    for path, index in ((first, served.index), (second, loader.load_local(second).index)):
        assert isinstance(index, ConfiguredIndex) and index.model_version == path.name
        ids = np.array(sorted({*range(0, 3000, 2), 2001}), dtype=np.int64)
        np.testing.assert_array_equal(index.item_ids, ids)
        viewer, offer = _weights(path, "t_viewer"), _weights(path, "t_offer")
        query = index.table_queries(users)
        np.testing.assert_array_equal(query, viewer[users % 1000])  # viewer: modulo 1000
        _assert_top(index, query, offer[ids % 2000], 10)  # offer: modulo 2000
        queries.append(query)
    assert not np.array_equal(*queries)  # each version its own weights
    indexed = ModelLoader(settings).load_index(second)  # an ingest worker's: no scorer
    assert isinstance(indexed.index, ConfiguredIndex)
    assert indexed.index.model_version == second.name
    assert indexed.configured is not None and indexed.index.plan is indexed.configured.retrieval


def test_an_identity_table_lists_its_rows_and_ids_an_event_could_not_bring_stay_out(
    tmp_path: Path,
) -> None:
    catalogue = tmp_path / "listings.txt"
    catalogue.write_text("-1\n5\n2999\n3000\n1000000\n")
    tables = {"query": {"source": "table", "table": "t_shopper"}}
    tables["items"] = {"source": "table", "table": "t_listing"}
    _, settings, (path,) = _example(
        "dcn", tmp_path, "unit", catalogue="file", catalogue_path=catalogue, **tables
    )
    index = ModelLoader(settings).retrieval_index(path)
    assert index is not None and index.item_ids.tolist() == [5, 2999]  # identity, dlq: < 3000
    settings = settings.model_copy(
        update={"retrieval": RetrievalSettings(catalogue="table", **tables)}  # type: ignore[arg-type]
    )
    index = ModelLoader(settings).retrieval_index(path)
    assert index is not None and index.item_ids.tolist() == list(range(3000))


def _redis_example(
    tmp: Path, prefix: str, url: str, **retrieval: Any
) -> tuple[Example, Settings, Path]:
    ex, settings, (path,) = _example("deepfm", tmp, prefix, **retrieval)
    features = settings.features
    assert features.item is not None
    item = features.item.model_copy(update={"fields": {"stats": "vector:2", "emb": "vector:4"}})
    features = features.model_copy(update={"item": item})
    return (
        ex,
        settings.model_copy(update={"features": features, "redis": RedisSettings(url=url)}),
        path,
    )


def test_item_vectors_of_redis_records_are_indexed_where_they_are_valid(
    tmp_path: Path, redis_client: redis.Redis, redis_settings: RedisSettings
) -> None:
    ex, settings, path = _redis_example(
        tmp_path,
        redis_settings.key_prefix,
        redis_settings.url,
        query={"source": "user", "field": "taste"},
        items={"source": "item", "field": "emb"},
    )
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((60, 4)).astype("<f4")
    pipe = redis_client.pipeline(transaction=False)
    for offer in range(60):
        key = ex.item_key.replace("{id}", str(offer))
        emb = vectors[offer].tobytes()
        if offer >= 50:
            emb = emb[:8] if offer % 2 else np.array([np.nan] * 4, "<f4").tobytes()
        pipe.hset(key, mapping={"stats": b"\0" * 8, "emb": emb})
    pipe.hset(ex.item_key.replace("{id}", "60"), mapping={"stats": b"\0" * 8})  # no emb
    pipe.set(ex.item_key.replace("{id}", "61"), b"a string, not a hash")
    pipe.hset(ex.item_key.replace("{id}", "x"), mapping={"emb": vectors[0].tobytes()})
    pipe.execute()
    assert key_ids(redis_client, ex.item_key).tolist() == list(range(62))

    index = ModelLoader(settings).retrieval_index(path)
    assert isinstance(index, ConfiguredIndex) and index.reads_users
    assert index.item_ids.tolist() == list(range(50))  # malformed, absent or WRONGTYPE: out
    queries = rng.standard_normal((5, 4)).astype(np.float32)
    _assert_top(index, queries, vectors[:50], 7)


def test_a_packed_layout_reads_one_vector_field_of_every_record(
    tmp_path: Path, redis_client: redis.Redis, redis_settings: RedisSettings
) -> None:
    ex = make_example("dcn", tmp_path, redis_settings.key_prefix, tmp_path / "v", steps=1)
    ex.script.seed(redis_client, ex.user_key, ex.item_key)
    settings = load_settings(ex.toml)
    _, fmap = configured_module(settings)
    assert fmap.item is not None
    ids = np.array([0, 7, 2999, 5000], dtype=np.int64)  # 5000: no record
    got, present = read_vectors(
        redis_client, fmap.item, fmap.item.field("quality"), ids, 1 << 20, 2
    )
    assert present.tolist() == [True, True, True, False]
    for row, listing in enumerate(ids[:3].tolist()):
        raw = redis_client.get(ex.item_key.replace("{id}", str(listing)))
        assert isinstance(raw, bytes)
        np.testing.assert_array_equal(got[row], np.frombuffer(raw[8:], "<f4"))
    assert not got[3].any()


@pytest.mark.parametrize("catalogue", ["redis", "file"])
def test_no_item_with_a_vector_is_no_index(
    tmp_path: Path, redis_settings: RedisSettings, catalogue: str
) -> None:
    listed = tmp_path / "none.txt"
    listed.write_text("1\n2\n")
    _, settings, path = _redis_example(
        tmp_path,
        redis_settings.key_prefix,
        redis_settings.url,
        query={"source": "user", "field": "taste"},
        items={"source": "item", "field": "emb"},
        catalogue=catalogue,
        catalogue_path=listed,
    )
    assert ModelLoader(settings).retrieval_index(path) is None  # logged; no_candidates
