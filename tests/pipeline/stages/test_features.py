"""fallback_flags, merge_recent and build_feature_columns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from model.features import FeatureColumns, build_model_input
from model.spec import FeatureSpec
from pipeline.feature_store import item_record_dtype
from pipeline.stages.batch import EventColumns, to_columns
from pipeline.stages.enrich import Enrichment, FallbackFeature
from pipeline.stages.features import build_feature_columns, fallback_flags, merge_recent

EventFactory = Callable[..., dict[str, Any]]
SPEC = FeatureSpec(
    embedding_dim=8, user_dense_dim=4, item_dense_dim=3, recent_items_cap=5, dense_arch=(16, 8)
)


def _i64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _events(make_event: EventFactory, candidates: list[list[int]], **fields: Any) -> EventColumns:
    return to_columns(
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
    return Enrichment(
        user_dense=rng.standard_normal((num_events, SPEC.user_dense_dim)).astype(np.float32),
        user_recent=[_i64(r) for r in (stored_recent or [[] for _ in range(num_events)])],
        user_missing=np.array(user_missing or [False] * num_events, dtype=bool),
        item_category=items["category"][inverse],
        item_dense=items["dense"][inverse],
        item_missing=np.array(item_missing or [False] * num_rows, dtype=bool),
    )


# ---------------------------------------------------------------------------- fallback_flags --


def test_item_flag_set_when_any_candidate_missing(make_event: EventFactory) -> None:
    events = _events(make_event, [[1, 2], [3], [4, 5, 6], [7]])
    enrichment = _enrichment(
        4,
        7,
        user_missing=[False, True, False, True],
        item_missing=[False, True, False, False, False, True, False],
    )
    flags = fallback_flags(events, enrichment)
    assert flags.item.tolist() == [True, False, True, False]
    assert flags.user.tolist() == [False, True, False, True]
    assert flags.item.dtype == np.bool_


def test_item_flag_first_and_last_rows(make_event: EventFactory) -> None:
    events = _events(make_event, [[1, 2, 3], [4, 5]])
    first = fallback_flags(events, _enrichment(2, 5, item_missing=[True] + [False] * 4))
    assert first.item.tolist() == [True, False]
    last = fallback_flags(events, _enrichment(2, 5, item_missing=[False] * 4 + [True]))
    assert last.item.tolist() == [False, True]


def test_no_fallback(make_event: EventFactory) -> None:
    events = _events(make_event, [[1], [2, 3]])
    flags = fallback_flags(events, _enrichment(2, 3))
    assert not flags.user.any()
    assert not flags.item.any()
    assert flags.names(0) == []
    assert flags.names(1) == []


def test_single_event(make_event: EventFactory) -> None:
    events = _events(make_event, [[1, 2, 3]])
    flags = fallback_flags(events, _enrichment(1, 3, item_missing=[False, False, True]))
    assert flags.item.tolist() == [True]


def test_names_per_event(make_event: EventFactory) -> None:
    events = _events(make_event, [[1], [2], [3], [4]])
    flags = fallback_flags(
        events,
        _enrichment(
            4, 4, user_missing=[True, False, True, False], item_missing=[True, True, False, False]
        ),
    )
    assert flags.names(0) == [FallbackFeature.USER.value, FallbackFeature.ITEM.value]
    assert flags.names(1) == ["item_features"]
    assert flags.names(2) == ["user_features"]
    assert flags.names(3) == []


def test_user_flags_are_a_copy(make_event: EventFactory) -> None:
    events = _events(make_event, [[1], [2]])
    enrichment = _enrichment(2, 2, user_missing=[True, False])
    flags = fallback_flags(events, enrichment)
    flags.user[:] = False
    assert enrichment.user_missing.tolist() == [True, False]


def test_flags_match_a_per_event_loop(make_event: EventFactory) -> None:
    rng = np.random.default_rng(11)
    counts = rng.integers(1, 6, 40).tolist()
    events = _events(make_event, [list(range(c)) for c in counts])
    missing = (rng.random(sum(counts)) < 0.1).tolist()
    flags = fallback_flags(events, _enrichment(40, sum(counts), item_missing=missing))
    starts = np.concatenate(([0], np.cumsum(counts)))
    expected = [any(missing[starts[e] : starts[e + 1]]) for e in range(40)]
    assert flags.item.tolist() == expected


# ------------------------------------------------------------------------------ merge_recent --


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
def test_merge_recent_rule(
    event_recent: list[int], stored: list[int], cap: int, expected: list[int]
) -> None:
    counts, flat = merge_recent(
        np.array([len(event_recent)]), _i64(event_recent), [_i64(stored)], cap
    )
    assert counts.tolist() == [len(expected)]
    assert flat.tolist() == expected
    assert counts.dtype == np.int64
    assert flat.dtype == np.int64


def test_merge_recent_many_events_flat_is_event_major() -> None:
    counts, flat = merge_recent(
        _i64([1, 0, 2, 0]), _i64([1, 2, 3]), [_i64([10, 11]), _i64([20]), _i64([]), _i64([])], 3
    )
    assert counts.tolist() == [3, 1, 2, 0]
    assert flat.tolist() == [1, 10, 11, 20, 2, 3]


def test_merge_recent_no_events() -> None:
    counts, flat = merge_recent(_i64([]), _i64([]), [], 5)
    assert counts.tolist() == []
    assert flat.tolist() == []
    assert flat.dtype == np.int64


def test_merge_recent_accepts_read_only_stored_arrays() -> None:
    stored = np.frombuffer(_i64([4, 5]).tobytes(), dtype=np.int64)  # like FeatureEnricher's
    counts, flat = merge_recent(_i64([1]), _i64([1]), [stored], 5)
    assert flat.tolist() == [1, 4, 5]
    assert counts.tolist() == [3]


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
    events = to_columns(records)
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
        user_recent=[np.empty(0, np.int64)] * 2,
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
