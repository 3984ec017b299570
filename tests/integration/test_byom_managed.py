"""Managed collisions: the DeepFM example served over a ManagedCollisionEmbeddingBagCollection
(``[model.module.managed_collision]``, tests/integration/managed.py) on the real broker and
Redis, its remappers' state loaded from the version and swapped with it: a new version whose
remappers hold other ids swaps in under load, and every score is the module's own forward of
the version that served it, on the KJT this test builds from the raw events and Redis values
(raw ids: the remappers map them onto the tables' rows). One process: a sharded job refuses
managed collisions in one line (tests/pipeline/cli/test_byom_feature_errors.py)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch

from model.module.factory import build_module
from model.module.store import import_state_dict
from model.module.types import ModuleConfig
from model.rank import RankContext
from model.store.versions import ModelVersions
from pipeline.models.preflight import configured_module
from pipeline.observability.metrics import Metrics
from pipeline.serve import build_pipeline
from pipeline.settings.loading import Settings
from pipeline.settings.retrieval import ModelSwapSettings
from tests.integration.byom import (
    Example,
    Stream,
    _kjt,
    deepfm_offer,
    deepfm_viewer,
    event_id,
    example_settings,
    hashed_row,
    make_example,
    string_id,
)
from tests.integration.conftest import BackgroundPipeline, collect, wait_for_outputs
from tests.integration.managed import INPUT_HASH_SIZE, managed_toml, trained_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SORTED_IDS = (
    "sparse_arch.embedding_bag_collection.managed._managed_collision_collection."
    "_managed_collision_modules.t_viewer._mch_sorted_raw_ids"
)


def managed_inputs(
    ex: Example, record: dict[str, Any], client: redis.Redis
) -> tuple[torch.Tensor, Any]:
    """One PageView's rows with raw ids: the keys' transforms map into the remappers' input
    range (2**20 ids), the module's remappers onto the rows."""
    viewer = record["viewer"]["id"]
    taste, segment, _ = deepfm_viewer(ex, client, viewer)
    bags: list[list[list[int]]] = [[], [], [], [], []]
    dense = []
    for offer in record["offer_ids"]:
        stats, _ = deepfm_offer(ex, client, offer)
        bags[0].append([viewer % INPUT_HASH_SIZE])
        bags[1].append([hashed_row(string_id(record["viewer"]["browser"]), INPUT_HASH_SIZE)])
        bags[2].append([offer % INPUT_HASH_SIZE])
        bags[3].append([r % INPUT_HASH_SIZE for r in record["recent_offer_ids"][:5]])
        bags[4].append(segment)
        dense.append([float(record["hour_of_day"]), *taste, *stats])
    keys = ["viewer", "browser", "offer", "recent_offers", "segment"]
    return torch.tensor(dense, dtype=torch.float32), _kjt(keys, bags)


def scores(
    config: ModuleConfig,
    state: dict[str, torch.Tensor],
    ex: Example,
    records: list[dict[str, Any]],
    client: redis.Redis,
) -> dict[str, dict[int, float]]:
    """Per event, every offer's probability from the module's own forward with ``state``."""
    module = build_module(config, "cpu")
    module.load_state_dict(state, strict=True)
    module.eval()
    out = {}
    for record in records:
        dense, sparse = managed_inputs(ex, record, client)
        with torch.no_grad():
            probs = module(dense, sparse).reshape(-1).double().tolist()
        out[event_id(record)] = dict(zip(record["offer_ids"], probs, strict=True))
    return out


def test_a_managed_collision_model_serves_and_swaps_its_remapping_state(
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    redis_client: redis.Redis,
    unique_name: Callable[[str], str],
    background_pipeline: Callable[..., BackgroundPipeline],
) -> None:
    versions_dir = tmp_path / "versions"
    ex = make_example("deepfm", tmp_path, unique_name("managed"), versions_dir, steps=1)
    ex.toml.write_text(managed_toml(ex.toml.read_text()))
    settings = example_settings(ex, settings_factory())
    settings = settings.model_copy(update={"model_swap": ModelSwapSettings(poll_interval_s=0.2)})
    ex.script.seed(redis_client, ex.user_key, ex.item_key)
    config, _ = configured_module(settings)
    assert config.managed_collision is not None
    old_state = trained_state(config, ex.script, seed=0, id_offset=0)
    new_state = trained_state(config, ex.script, seed=1, id_offset=400)
    old_ids, new_ids = old_state[SORTED_IDS], new_state[SORTED_IDS]
    assert int(old_ids[0]) == 0 and int(new_ids[0]) == 400  # other ids remapped
    versions = ModelVersions.create(versions_dir)
    for name, state in (("old", old_state), ("new", new_state)):
        torch.save(state, tmp_path / f"{name}.pt")
        import_state_dict(config, tmp_path / f"{name}.pt", versions, name, promote=name == "old")

    pipeline = build_pipeline(
        settings, RankContext(), Metrics(), checkpoint=versions.current_path()
    )
    bp = background_pipeline(settings, pipeline=pipeline)
    stream = Stream(settings, ex, n=600, rate=120).start()
    registry = pipeline.metrics.registry
    assert wait_for_outputs(settings, 150) >= 150
    versions.promote("new")
    deadline = time.monotonic() + 120
    while registry.get_sample_value("streamrank_model_swaps_total") != 1:
        assert time.monotonic() < deadline, "the new version was not swapped in"
        time.sleep(0.1)
    records = stream.join()
    recs = collect(settings, expected=len(records))
    bp.stop()

    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == {event_id(r) for r in records} and max(counts.values()) == 1
    served = Counter(r["model_version"] for r in recs)
    assert set(served) == {"old", "new"} and min(served.values()) > 0
    by_id = {event_id(r): r for r in records}
    worst, changed = 0.0, 0.0
    for version, state in (("old", old_state), ("new", new_state)):
        mine = [by_id[r["event_id"]] for r in recs if r["model_version"] == version]
        want = scores(config, state, ex, mine, redis_client)
        other = scores(config, new_state if version == "old" else old_state, ex, mine, redis_client)
        for rec in (r for r in recs if r["model_version"] == version):
            for item in rec["items"]:
                worst = max(worst, abs(item["score"] - want[rec["event_id"]][item["item_id"]]))
                changed = max(changed, abs(item["score"] - other[rec["event_id"]][item["item_id"]]))
    assert worst <= 1e-5
    assert changed > 1e-3  # the swap changed what the raw ids look up
    viewers = np.array([by_id[r["event_id"]]["viewer"]["id"] for r in recs])
    assert (viewers < 400).any()  # ids the new remappers no longer hold were served
