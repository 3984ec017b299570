"""The features stage: the recent-items rule and build_feature_columns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from model.features import recent_items
from model.features.build import FeatureColumns, build_model_input
from model.features.recent_items import merge_recent_items
from model.features.segments import flatten
from model.features.spec import FeatureSpec
from pipeline.connectors.avro.reference import (
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
    records_to_columns,
)
from pipeline.connectors.redis.feature_store import item_record_dtype
from pipeline.settings.codec import CodecSettings
from pipeline.stages.decode import MessageDecoder
from pipeline.stages.features import BuiltinFeatures, build_feature_columns
from pipeline.types import Enrichment, EventColumns
from tests.support.kernel_types import record_argument_types

EventFactory = Callable[..., dict[str, Any]]
SPEC = FeatureSpec(
    embedding_dim=8, user_dense_dim=4, item_dense_dim=3, recent_items_cap=5, dense_arch=(16, 8)
)


def _i64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _events(make_event: EventFactory, candidates: list[list[int]], **fields: Any) -> EventColumns:
    return records_to_columns(
        [
            make_event(event_id=f"e{i}", user_id=i, candidate_item_ids=c, **fields)
            for i, c in enumerate(candidates)
        ]
    )


def _enrichment(
    num_events: int,
    num_rows: int,
    user_missing: list[bool] | None = None,
    item_missing: list[bool] | None = None,
    stored_recent: list[list[int]] | None = None,
    seed: int = 0,
) -> Enrichment:
    """Shaped like FeatureEnricher's output (structured-array fields included)."""
    rng = np.random.default_rng(seed)
    items = np.zeros(num_rows, dtype=item_record_dtype(SPEC.item_dense_dim))
    items["category"] = rng.integers(0, 10**12, num_rows)
    items["dense"] = rng.standard_normal((num_rows, SPEC.item_dense_dim))
    inverse = np.arange(num_rows)
    recent_counts, recent_ids = flatten(stored_recent or [[] for _ in range(num_events)])
    return Enrichment(
        user_dense=rng.standard_normal((num_events, SPEC.user_dense_dim)).astype(np.float32),
        user_recent_counts=recent_counts,
        user_recent_ids=recent_ids,
        user_missing=np.array(user_missing or [False] * num_events, dtype=bool),
        item_category=items["category"][inverse],
        item_dense=items["dense"][inverse],
        item_missing=np.array(item_missing or [False] * num_rows, dtype=bool),
    )


# ---------------------------------------------------------------------- the recent-items rule --


def _merge(
    event_recent: list[list[int]], stored: list[list[int]], cap: int
) -> tuple[np.ndarray, np.ndarray]:
    return merge_recent_items(*flatten(event_recent), *flatten(stored), cap)


@pytest.mark.parametrize(
    ("event_recent", "stored", "cap", "expected"),
    [
        ([1, 2], [3, 4, 5], 4, [1, 2, 3, 4]),
        ([1, 2], [3], 10, [1, 2, 3]),
        ([], [7, 8], 5, [7, 8]),
        ([9, 8, 7], [], 5, [9, 8, 7]),
        (list(range(10)), [], 4, [0, 1, 2, 3]),
        ([], [], 5, []),
        (list(range(10)), [100], 4, [0, 1, 2, 3]),
        ([], list(range(10)), 3, [0, 1, 2]),
        ([5], [5, 6], 5, [5, 5, 6]),  # no de-duplication: the training rule
        ([1, 2, 3], [4], 3, [1, 2, 3]),
    ],
)
def test_recent_items_rule(
    event_recent: list[int], stored: list[int], cap: int, expected: list[int]
) -> None:
    counts, flat = _merge([event_recent], [stored], cap)
    assert counts.tolist() == [len(expected)]
    assert flat.tolist() == expected
    assert counts.dtype == np.int64
    assert flat.dtype == np.int64


def test_recent_items_of_many_events_are_event_major() -> None:
    counts, flat = _merge([[1], [], [2, 3], []], [[10, 11], [20], [], []], 3)
    assert counts.tolist() == [3, 1, 2, 0]
    assert flat.tolist() == [1, 10, 11, 20, 2, 3]


def test_recent_items_of_no_events() -> None:
    counts, flat = _merge([], [], 5)
    assert counts.tolist() == []
    assert flat.tolist() == []
    assert flat.dtype == np.int64


# --------------------------------------------------------------------- build_feature_columns --


def test_build_feature_columns_validates_and_matches_inputs(make_event: EventFactory) -> None:
    records = [
        make_event(
            event_id="a",
            user_id=7,
            candidate_item_ids=[10, 11, 12],
            recent_item_ids=[1, 2],
            context={"device": "ios", "country": "DE"},
        ),
        make_event(
            event_id="b",
            user_id=8,
            candidate_item_ids=[20],
            recent_item_ids=[],
            context={"device": "web", "country": "US"},
        ),
        make_event(
            event_id="c",
            user_id=9,
            candidate_item_ids=[30, 31],
            recent_item_ids=[3, 4, 5, 6, 7],
            context={"device": "android", "country": "FR"},
        ),
    ]
    events = records_to_columns(records)
    enrichment = _enrichment(3, 6, stored_recent=[[50, 51, 52, 53], [60], [70]])
    cols = build_feature_columns(events, enrichment, SPEC)
    assert isinstance(cols, FeatureColumns)
    cols.validate(SPEC)

    np.testing.assert_array_equal(cols.user_ids, [7, 8, 9])
    np.testing.assert_array_equal(cols.device_ids, events.device_ids)
    np.testing.assert_array_equal(cols.country_ids, events.country_ids)
    np.testing.assert_array_equal(cols.candidate_counts, [3, 1, 2])
    np.testing.assert_array_equal(cols.candidate_ids, [10, 11, 12, 20, 30, 31])
    np.testing.assert_array_equal(cols.recent_counts, [5, 1, 5])
    np.testing.assert_array_equal(cols.recent_ids, [1, 2, 50, 51, 52, 60, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(cols.user_dense, enrichment.user_dense)
    np.testing.assert_array_equal(cols.item_category, enrichment.item_category)
    np.testing.assert_array_equal(cols.item_dense, enrichment.item_dense)

    model_input = build_model_input(cols, SPEC)
    assert model_input.num_rows == 6
    assert model_input.sparse.keys() == SPEC.feature_names


def test_build_feature_columns_with_all_defaults(make_event: EventFactory) -> None:
    events = _events(make_event, [[1, 2], [3]], recent_item_ids=[])
    enrichment = Enrichment(
        user_dense=np.zeros((2, SPEC.user_dense_dim), np.float32),
        user_recent_counts=np.zeros(2, np.int64),
        user_recent_ids=np.zeros(0, np.int64),
        user_missing=np.ones(2, bool),
        item_category=np.zeros(3, np.int64),
        item_dense=np.zeros((3, SPEC.item_dense_dim), np.float32),
        item_missing=np.ones(3, bool),
    )
    cols = build_feature_columns(events, enrichment, SPEC)
    cols.validate(SPEC)
    assert cols.recent_counts.tolist() == [0, 0]
    assert cols.recent_ids.size == 0


def test_build_feature_columns_caps_long_recent_lists(make_event: EventFactory) -> None:
    events = _events(make_event, [[1]], recent_item_ids=list(range(100, 120)))
    enrichment = _enrichment(1, 1, stored_recent=[list(range(200, 230))])
    cols = build_feature_columns(events, enrichment, SPEC)
    cols.validate(SPEC)  # would raise if recent_counts exceeded the cap
    assert cols.recent_ids.tolist() == list(range(100, 100 + SPEC.recent_items_cap))


def test_the_warm_up_loads_the_recent_items_kernel_a_decoded_batch_runs(
    monkeypatch: pytest.MonkeyPatch, make_event: EventFactory
) -> None:
    """``BuiltinFeatures()`` runs the recent-items kernel once with arguments of the numba
    types a decoded batch passes: another type would be a specialization of its own, loaded
    or compiled when the first batch comes."""
    calls = record_argument_types(monkeypatch, recent_items, "_merge")
    BuiltinFeatures()
    (warm_up,) = calls
    codec = RecordCodec(CodecSettings(), USER_EVENT_SCHEMA_FILE, "in")
    event = make_event(candidate_item_ids=[4, 5], recent_item_ids=[1, 2])
    events, _, _ = MessageDecoder(CodecSettings(), 5).decode_values([codec.encode(event)])
    build_feature_columns(events, _enrichment(1, events.num_rows, stored_recent=[[3]]), SPEC)
    assert calls[1] == warm_up
