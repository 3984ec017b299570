"""Shared fixtures for the model tests: a small spec, a small world and a batch from it."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from model.features.build import FeatureColumns
from model.features.spec import FeatureSpec
from model.synthetic import SampledEvents, SyntheticWorld, WorldConfig, feature_columns
from tests.support.specs import feature_tables


def small_spec(**overrides: object) -> FeatureSpec:
    """A FeatureSpec small enough for fast tests (tables of a few thousand rows)."""
    kwargs: dict[str, object] = {
        "tables": feature_tables(4_000, 8_000, 101, 16, 32, 8_000),
        "embedding_dim": 16,
        "user_dense_dim": 4,
        "item_dense_dim": 5,
        "recent_items_cap": 6,
        "dense_arch": (32, 16),
        "over_arch": (32, 1),
    }
    kwargs.update(overrides)
    return FeatureSpec(**kwargs)  # type: ignore[arg-type]


SMALL_WORLD = WorldConfig(
    num_users=2_000,
    num_items=5_000,
    num_categories=50,
    seed=11,
    user_dense_dim=4,
    item_dense_dim=5,
    min_candidates=3,
    max_candidates=30,
    max_recent=4,
)


@pytest.fixture(scope="session")
def spec() -> FeatureSpec:
    return small_spec()


@pytest.fixture(scope="session")
def world() -> SyntheticWorld:
    return SyntheticWorld(SMALL_WORLD)


@pytest.fixture(scope="session")
def events(world: SyntheticWorld) -> SampledEvents:
    return world.sample_events(64, np.random.default_rng(3))


@pytest.fixture(scope="session")
def cols(events: SampledEvents, world: SyntheticWorld, spec: FeatureSpec) -> FeatureColumns:
    return feature_columns(events, world, spec)


@pytest.fixture()
def single_thread() -> Iterator[None]:
    """Run torch on one intra-op thread for the test, then restore the previous setting.

    On a shared 2-core machine two spinning OpenMP threads slow small models down by 10x or
    more when another process is busy; one thread is both faster and steadier for tests.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
