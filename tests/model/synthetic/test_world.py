"""Tests for model.synthetic: determinism, shapes, the recent-items rule, the event dicts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from model.features.spec import FeatureSpec, string_to_id
from model.synthetic import (
    ITEM_ID_BASE,
    SampledEvents,
    SyntheticWorld,
    WorldConfig,
    feature_columns,
    row_click_probability,
    sample_labels,
    to_event_dicts,
)
from model.synthetic.evaluation import roc_auc

TINY = WorldConfig(num_users=300, num_items=800, num_categories=10, seed=5, max_candidates=40)


def test_same_seed_same_world() -> None:
    a, b = SyntheticWorld(TINY), SyntheticWorld(TINY)
    for name, value in vars(a).items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, getattr(b, name), err_msg=name)
    c = SyntheticWorld(dataclasses.replace(TINY, seed=6))
    assert not np.array_equal(a.user_latent, c.user_latent)


def test_same_rng_same_events() -> None:
    world = SyntheticWorld(TINY)
    a = world.sample_events(50, np.random.default_rng(1))
    b = world.sample_events(50, np.random.default_rng(1))
    for f in dataclasses.fields(SampledEvents):
        np.testing.assert_array_equal(getattr(a, f.name), getattr(b, f.name), err_msg=f.name)
    la = sample_labels(a, world, np.random.default_rng(2))
    lb = sample_labels(b, world, np.random.default_rng(2))
    np.testing.assert_array_equal(la, lb)


def test_world_arrays(world: SyntheticWorld) -> None:
    cfg = world.config
    assert world.user_ids.dtype == np.int64 and (world.user_ids > 0).all()
    assert world.item_ids.min() >= ITEM_ID_BASE
    assert len(np.unique(world.item_ids)) == cfg.num_items
    assert world.user_dense.shape == (cfg.num_users, cfg.user_dense_dim)
    assert world.item_dense.shape == (cfg.num_items, cfg.item_dense_dim)
    assert world.user_dense.dtype == world.item_dense.dtype == np.float32
    assert world.item_category.min() >= 1000
    np.testing.assert_allclose(world.item_popularity.sum(), 1.0)
    assert world.user_recent.shape == (cfg.num_users, cfg.max_recent)
    valid = np.arange(cfg.max_recent)[None, :] < world.user_recent_counts[:, None]
    assert (world.user_recent[valid] >= 0).all() and (world.user_recent[~valid] == -1).all()
    np.testing.assert_array_equal(world.device_ids[0], string_to_id(cfg.devices[0]))
    u = 17
    np.testing.assert_array_equal(
        world.stored_recent_item_ids(u),
        world.item_ids[world.user_recent[u, : world.user_recent_counts[u]]],
    )
    assert world.item_index_of(world.item_ids[[3, 9]]).tolist() == [3, 9]
    assert world.user_index_of(world.user_ids[[0, 5]]).tolist() == [0, 5]
    with pytest.raises(KeyError):
        world.item_index_of([int(world.item_ids[0]) + 1])


def test_events_shape(world: SyntheticWorld, events: SampledEvents) -> None:
    cfg = world.config
    counts = events.candidate_counts
    assert counts.min() >= cfg.min_candidates and counts.max() <= cfg.max_candidates
    assert events.num_rows == counts.sum()
    start = 0
    for c in counts.tolist():
        chunk = events.candidate_items[start : start + c]
        assert len(np.unique(chunk)) == c  # no repeats within an event
        start += c
    assert (events.recent_counts[~events.has_recent] == 0).all()
    assert events.recent_counts.max() <= cfg.max_event_recent
    assert events.recent_items.shape == (events.recent_counts.sum(),)
    assert np.isin(events.num_results, cfg.num_results_choices).all()
    assert (np.diff(events.event_time_ms) >= 0).all()
    assert len(set(events.event_ids())) == events.num_events


def test_popular_items_are_drawn_more(world: SyntheticWorld) -> None:
    events = world.sample_events(300, np.random.default_rng(0))
    seen = np.bincount(events.candidate_items, minlength=world.num_items)
    top = np.argsort(-world.item_popularity)[:20]
    bottom = np.argsort(world.item_popularity)[:1000]
    assert seen[top].mean() > 10 * seen[bottom].mean()


def _slow_recent(events: SampledEvents, world: SyntheticWorld, cap: int) -> list[list[int]]:
    out, pos = [], 0
    for e in range(events.num_events):
        own = events.recent_items[pos : pos + events.recent_counts[e]].tolist()
        pos += int(events.recent_counts[e])
        u = int(events.user_index[e])
        stored = world.user_recent[u, : world.user_recent_counts[u]].tolist()
        out.append([int(world.item_ids[i]) for i in (own + stored)[:cap]])
    return out


@pytest.mark.parametrize("cap", [0, 2, 6])
def test_feature_columns_recent_rule(
    world: SyntheticWorld, events: SampledEvents, spec: FeatureSpec, cap: int
) -> None:
    cols = feature_columns(events, world, dataclasses.replace(spec, recent_items_cap=cap))
    got, pos = [], 0
    for c in cols.recent_counts.tolist():
        got.append(cols.recent_ids[pos : pos + c].tolist())
        pos += c
    assert got == _slow_recent(events, world, cap)


def test_feature_columns_lookup(
    world: SyntheticWorld, events: SampledEvents, spec: FeatureSpec
) -> None:
    cols = feature_columns(events, world, spec)
    np.testing.assert_array_equal(cols.user_ids, world.user_ids[events.user_index])
    np.testing.assert_array_equal(cols.candidate_ids, world.item_ids[events.candidate_items])
    np.testing.assert_array_equal(cols.item_dense, world.item_dense[events.candidate_items])
    np.testing.assert_array_equal(cols.user_dense, world.user_dense[events.user_index])
    np.testing.assert_array_equal(cols.country_ids, world.country_ids[events.country_index])
    with pytest.raises(ValueError, match="dense dims"):
        feature_columns(events, world, dataclasses.replace(spec, user_dense_dim=99))


def test_event_dicts_match_columns(
    world: SyntheticWorld, events: SampledEvents, spec: FeatureSpec
) -> None:
    records = list(to_event_dicts(events, world))
    cols = feature_columns(events, world, spec)
    assert len(records) == events.num_events
    pos = 0
    for e, rec in enumerate(records):
        assert set(rec) == {
            "event_id",
            "user_id",
            "event_time",
            "context",
            "candidate_item_ids",
            "recent_item_ids",
            "num_results",
        }
        assert isinstance(rec["user_id"], int) and rec["user_id"] == cols.user_ids[e]
        assert len(rec["event_id"]) == 32
        assert rec["context"]["device"] in world.config.devices
        assert string_to_id(rec["context"]["country"]) == cols.country_ids[e]
        c = int(cols.candidate_counts[e])
        assert rec["candidate_item_ids"] == cols.candidate_ids[pos : pos + c].tolist()
        pos += c
        if events.has_recent[e]:
            assert isinstance(rec["recent_item_ids"], list)
            assert len(rec["recent_item_ids"]) == events.recent_counts[e]
        else:
            assert rec["recent_item_ids"] is None


def test_click_probability_carries_signal(world: SyntheticWorld) -> None:
    events = world.sample_events(400, np.random.default_rng(4))
    probs = row_click_probability(events, world)
    labels = sample_labels(events, world, np.random.default_rng(5))
    assert labels.dtype == np.float32 and labels.shape == (events.num_rows,)
    assert 0.05 < labels.mean() < 0.6
    assert roc_auc(labels, probs) > 0.8
    p = world.click_probability(np.zeros(3, dtype=np.int64), np.arange(3), 0, 0)
    assert p.shape == (3,) and ((p > 0) & (p < 1)).all()


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="max_candidates"):
        WorldConfig(num_items=10, max_candidates=20)
    with pytest.raises(ValueError):
        WorldConfig(devices=())


def test_zero_events_and_full_catalog() -> None:
    world = SyntheticWorld(
        WorldConfig(
            num_users=20, num_items=30, num_categories=3, min_candidates=30, max_candidates=30
        )
    )
    empty = world.sample_events(0, np.random.default_rng(0))
    assert empty.num_events == 0 and list(to_event_dicts(empty, world)) == []
    full = world.sample_events(5, np.random.default_rng(0))
    items = full.candidate_items.reshape(5, 30)
    assert (np.sort(items, axis=1) == np.arange(30)).all()  # every item exactly once
