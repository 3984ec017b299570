"""Tests for model.features.build: column validation, KJT/dense layout, padding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from model.features.build import (
    FeatureColumns,
    build_model_input,
)
from model.features.model_input import ModelInput, pad_model_input
from model.features.segments import segment_ids
from model.features.spec import FeatureSpec, SparseFeature, string_to_id


def _slow_reference(cols: FeatureColumns, spec: FeatureSpec) -> dict[str, list[list[int]]]:
    """Per-row bags of hashed ids, built with plain Python loops."""

    def h(feature: SparseFeature, raw: int) -> int:
        return int(spec.hash_ids(feature, np.array([raw], dtype=np.int64))[0])

    bags: dict[str, list[list[int]]] = {name: [] for name in spec.feature_names}
    row = 0
    recent_pos = 0
    for e in range(cols.num_events):
        recent = [int(x) for x in cols.recent_ids[recent_pos : recent_pos + cols.recent_counts[e]]]
        recent_pos += int(cols.recent_counts[e])
        for _ in range(int(cols.candidate_counts[e])):
            bags["user_id"].append([h(SparseFeature.USER_ID, int(cols.user_ids[e]))])
            bags["item_id"].append([h(SparseFeature.ITEM_ID, int(cols.candidate_ids[row]))])
            bags["item_category"].append(
                [h(SparseFeature.ITEM_CATEGORY, int(cols.item_category[row]))]
            )
            bags["device"].append([h(SparseFeature.DEVICE, int(cols.device_ids[e]))])
            bags["country"].append([h(SparseFeature.COUNTRY, int(cols.country_ids[e]))])
            bags["recent_items"].append([h(SparseFeature.RECENT_ITEMS, r) for r in recent])
            row += 1
    return bags


def _random_columns(rng: np.random.Generator, spec: FeatureSpec, num_events: int) -> FeatureColumns:
    counts = rng.integers(0, 9, size=num_events).astype(np.int64)
    counts[0] = 3  # at least some rows
    recent_counts = rng.integers(0, spec.recent_items_cap + 1, size=num_events).astype(np.int64)
    rows, recents = int(counts.sum()), int(recent_counts.sum())

    def ids(n: int) -> np.ndarray:
        return rng.integers(-(2**62), 2**62, size=n, dtype=np.int64)

    return FeatureColumns(
        user_ids=ids(num_events),
        device_ids=np.array(
            [string_to_id(s) for s in rng.choice(["ios", "web"], num_events)], dtype=np.int64
        ),
        country_ids=ids(num_events),
        candidate_counts=counts,
        candidate_ids=ids(rows),
        recent_counts=recent_counts,
        recent_ids=ids(recents),
        user_dense=rng.standard_normal((num_events, spec.user_dense_dim)).astype(np.float32),
        item_category=rng.integers(1000, 1100, size=rows).astype(np.int64),
        item_dense=rng.standard_normal((rows, spec.item_dense_dim)).astype(np.float32),
    )


def test_kjt_layout_matches_slow_reference(spec: FeatureSpec) -> None:
    rng = np.random.default_rng(1)
    cols = _random_columns(rng, spec, 40)
    inp = build_model_input(cols, spec)
    kjt = inp.sparse
    assert kjt.keys() == spec.feature_names
    assert kjt.stride() == cols.num_rows
    assert kjt.values().dtype == torch.int64 and kjt.lengths().dtype == torch.int64
    expected = _slow_reference(cols, spec)
    for name, jt in kjt.to_dict().items():
        got = [t.tolist() for t in jt.to_dense()]
        assert got == expected[name], name
    for name in ("user_id", "item_id", "item_category", "device", "country"):
        assert (kjt[name].lengths() == 1).all()


def test_kjt_values_within_tables(cols: FeatureColumns, spec: FeatureSpec) -> None:
    kjt = build_model_input(cols, spec).sparse
    for table in spec.tables:
        values = kjt[table.feature.value].values()
        assert values.numel() == 0 or (values.min() >= 0 and values.max() < table.num_embeddings)


def test_recent_items_repeated_per_candidate(spec: FeatureSpec) -> None:
    cols = FeatureColumns(
        user_ids=np.array([1, 2, 3], dtype=np.int64),
        device_ids=np.array([4, 5, 6], dtype=np.int64),
        country_ids=np.array([7, 8, 9], dtype=np.int64),
        candidate_counts=np.array([2, 0, 3], dtype=np.int64),
        candidate_ids=np.array([10, 11, 12, 13, 14], dtype=np.int64),
        recent_counts=np.array([2, 1, 0], dtype=np.int64),
        recent_ids=np.array([100, 101, 102], dtype=np.int64),
        user_dense=np.zeros((3, spec.user_dense_dim), dtype=np.float32),
        item_category=np.array([1, 1, 2, 2, 2], dtype=np.int64),
        item_dense=np.zeros((5, spec.item_dense_dim), dtype=np.float32),
    )
    recent = build_model_input(cols, spec).sparse["recent_items"]
    hashed = spec.hash_ids(SparseFeature.RECENT_ITEMS, np.array([100, 101], dtype=np.int64))
    assert recent.lengths().tolist() == [2, 2, 0, 0, 0]
    assert recent.values().tolist() == [*hashed.tolist(), *hashed.tolist()]


def test_dense_layout(cols: FeatureColumns, spec: FeatureSpec) -> None:
    dense = build_model_input(cols, spec).dense
    assert dense.dtype == torch.float32
    assert dense.shape == (cols.num_rows, spec.dense_dim)
    events = segment_ids(cols.candidate_counts)
    np.testing.assert_array_equal(dense[:, : spec.user_dense_dim].numpy(), cols.user_dense[events])
    np.testing.assert_array_equal(dense[:, spec.user_dense_dim :].numpy(), cols.item_dense)


def test_empty_batch(spec: FeatureSpec, cols: FeatureColumns) -> None:
    empty = cols.slice_events(0, 0)
    inp = build_model_input(empty, spec)
    assert inp.num_rows == 0
    assert inp.sparse.lengths().numel() == 0


def test_validate_reports_mismatches(cols: FeatureColumns, spec: FeatureSpec) -> None:
    cols.validate(spec)
    bad_cases = {
        "candidate_ids": dataclasses.replace(cols, candidate_ids=cols.candidate_ids[:-1]),
        "item_dense": dataclasses.replace(cols, item_dense=cols.item_dense[:, :-1]),
        "user_dense": dataclasses.replace(cols, user_dense=cols.user_dense[:-1]),
        "device_ids": dataclasses.replace(cols, device_ids=cols.device_ids[:-1]),
        "recent_ids": dataclasses.replace(cols, recent_ids=np.append(cols.recent_ids, 1)),
        "int64": dataclasses.replace(cols, user_ids=cols.user_ids.astype(np.int32)),
        "float32": dataclasses.replace(cols, item_dense=cols.item_dense.astype(np.float64)),
        "recent_items_cap": dataclasses.replace(
            cols, recent_counts=np.full_like(cols.recent_counts, spec.recent_items_cap + 1)
        ),
    }
    for message, bad in bad_cases.items():
        with pytest.raises(ValueError, match=message):
            bad.validate(spec)
        with pytest.raises(ValueError):
            build_model_input(bad, spec)


def test_slice_and_concat_round_trip(cols: FeatureColumns, spec: FeatureSpec) -> None:
    parts = [cols.slice_events(0, 10), cols.slice_events(10, 11), cols.slice_events(11, None)]
    for p in parts:
        p.validate(spec)
    assert sum(p.num_events for p in parts) == cols.num_events
    merged = FeatureColumns.concat(parts)
    for f in dataclasses.fields(FeatureColumns):
        np.testing.assert_array_equal(getattr(merged, f.name), getattr(cols, f.name))
    whole = build_model_input(cols, spec)
    pieces = [build_model_input(p, spec) for p in parts]
    torch.testing.assert_close(torch.cat([p.dense for p in pieces]), whole.dense)
    with pytest.raises(ValueError):
        FeatureColumns.concat([])


def test_pad_model_input(cols: FeatureColumns, spec: FeatureSpec) -> None:
    inp = build_model_input(cols, spec)
    target = inp.num_rows + 7
    padded = pad_model_input(inp, target)
    assert padded.num_rows == target
    assert padded.sparse.stride() == target
    assert padded.sparse.keys() == spec.feature_names
    torch.testing.assert_close(padded.dense[: inp.num_rows], inp.dense)
    assert (padded.dense[inp.num_rows :] == 0).all()
    assert torch.equal(padded.sparse.values(), inp.sparse.values())
    for name in spec.feature_names:
        lengths = padded.sparse[name].lengths()
        assert torch.equal(lengths[: inp.num_rows], inp.sparse[name].lengths())
        assert (lengths[inp.num_rows :] == 0).all()
    assert pad_model_input(inp, inp.num_rows) is inp
    with pytest.raises(ValueError, match="cannot pad"):
        pad_model_input(inp, inp.num_rows - 1)


def test_model_input_to(cols: FeatureColumns, spec: FeatureSpec) -> None:
    inp = build_model_input(cols, spec)
    moved = inp.to("cpu")
    assert isinstance(moved, ModelInput)
    assert moved.dense.device.type == "cpu"
    assert torch.equal(moved.sparse.values(), inp.sparse.values())


def _numpy_layout(cols: FeatureColumns, spec: FeatureSpec) -> tuple[np.ndarray, np.ndarray]:
    """The KJT's flat values and lengths by numpy index arithmetic (the formulation the
    compiled pass replaced)."""
    row_event = segment_ids(cols.candidate_counts)
    recent_hashed = spec.hash_ids(SparseFeature.RECENT_ITEMS, cols.recent_ids)
    starts = np.concatenate([[0], np.cumsum(cols.recent_counts)[:-1]]).astype(np.int64)
    row_len = cols.recent_counts[row_event]
    recent_index = np.repeat(starts[row_event], row_len) + (
        np.arange(int(row_len.sum())) - np.repeat(np.cumsum(row_len) - row_len, row_len)
    )
    values = np.concatenate(
        [
            spec.hash_ids(SparseFeature.USER_ID, cols.user_ids)[row_event],
            spec.hash_ids(SparseFeature.ITEM_ID, cols.candidate_ids),
            spec.hash_ids(SparseFeature.ITEM_CATEGORY, cols.item_category),
            spec.hash_ids(SparseFeature.DEVICE, cols.device_ids)[row_event],
            spec.hash_ids(SparseFeature.COUNTRY, cols.country_ids)[row_event],
            recent_hashed[recent_index],
        ]
    )
    lengths = np.concatenate([np.ones(5 * cols.num_rows, dtype=np.int64), row_len])
    return values, lengths


@pytest.mark.parametrize("seed", range(3))
def test_flat_layout_equals_the_numpy_formulation(spec: FeatureSpec, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cols = _random_columns(rng, spec, 50)
    cols.candidate_counts[1] = 0  # an event without rows
    cols = dataclasses.replace(
        cols,
        candidate_ids=cols.candidate_ids[: int(cols.candidate_counts.sum())],
        item_category=cols.item_category[: int(cols.candidate_counts.sum())],
        item_dense=cols.item_dense[: int(cols.candidate_counts.sum())],
    )
    inp = build_model_input(cols, spec)
    values, lengths = _numpy_layout(cols, spec)
    np.testing.assert_array_equal(inp.sparse.values().numpy(), values)
    np.testing.assert_array_equal(inp.sparse.lengths().numpy(), lengths)
    per_key = [cols.num_rows] * 5 + [int(lengths[5 * cols.num_rows :].sum())]
    assert inp.sparse.length_per_key() == per_key


def test_strided_columns_give_the_same_input(spec: FeatureSpec) -> None:
    """Views that are not contiguous (e.g. a column of a wider array) are laid out the same."""
    cols = _random_columns(np.random.default_rng(7), spec, 20)
    wide = np.stack([cols.candidate_ids, cols.candidate_ids], axis=1)
    dense = np.concatenate([cols.item_dense, cols.item_dense], axis=1)
    strided = dataclasses.replace(
        cols, candidate_ids=wide[:, 0], item_dense=dense[:, : spec.item_dense_dim]
    )
    assert not strided.candidate_ids.flags.c_contiguous
    a, b = build_model_input(cols, spec), build_model_input(strided, spec)
    assert torch.equal(a.sparse.values(), b.sparse.values())
    assert torch.equal(a.dense, b.dense)
