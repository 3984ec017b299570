"""Tests for model.features.spec: hashing and the spec's dict round trip."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from model.features.spec import (
    FeatureSpec,
    SparseFeature,
    TableSpec,
    hash_to_rows,
    spec_from_dict,
    spec_to_dict,
    string_to_id,
)


def test_hash_to_rows_range_and_dtype() -> None:
    rng = np.random.default_rng(0)
    raw = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=10_000, dtype=np.int64)
    for num_rows in (1, 7, 1_000, 100_000):
        rows = hash_to_rows(raw, num_rows, salt=3)
        assert rows.dtype == np.int64
        assert rows.shape == raw.shape
        assert rows.min() >= 0 and rows.max() < num_rows


def test_hash_to_rows_deterministic_and_salted() -> None:
    raw = np.arange(5_000, dtype=np.int64) * 104_729 + 5 * 10**12
    a = hash_to_rows(raw, 1_000, salt=1)
    np.testing.assert_array_equal(a, hash_to_rows(raw.copy(), 1_000, salt=1))
    b = hash_to_rows(raw, 1_000, salt=2)
    assert (a != b).mean() > 0.9  # a new salt re-randomises rows


def test_hash_to_rows_spreads_ids() -> None:
    raw = np.arange(100_000, dtype=np.int64)  # consecutive ids must not cluster
    counts = np.bincount(hash_to_rows(raw, 100, salt=0), minlength=100)
    assert counts.min() > 850 and counts.max() < 1_150


def test_hash_to_rows_keeps_shape_and_handles_negative() -> None:
    raw = np.array([[-1, 0], [np.iinfo(np.int64).min, np.iinfo(np.int64).max]], dtype=np.int64)
    rows = hash_to_rows(raw, 10)
    assert rows.shape == (2, 2)
    assert ((rows >= 0) & (rows < 10)).all()


def test_spec_hash_ids_uses_table_size_and_salt() -> None:
    spec = FeatureSpec(hash_salt=99)
    raw = np.arange(1_000, dtype=np.int64)
    rows = spec.hash_ids(SparseFeature.DEVICE, raw)
    np.testing.assert_array_equal(rows, hash_to_rows(raw, 64, 99))


def test_string_to_id_stable() -> None:
    assert string_to_id("ios") == string_to_id("ios")
    assert string_to_id("ios") != string_to_id("android")
    assert -(2**63) <= string_to_id("DE") < 2**63


def test_spec_dict_round_trip_through_json() -> None:
    spec = FeatureSpec(
        tables=tuple(TableSpec(f, 10 + i) for i, f in enumerate(SparseFeature)),
        embedding_dim=8,
        dense_arch=(16, 8),
        over_arch=(4, 1),
        recent_items_cap=3,
        hash_salt=1234,
    )
    data = json.loads(json.dumps(spec_to_dict(spec)))
    assert spec_from_dict(data) == spec
    assert data["tables"][0] == {"feature": "user_id", "num_embeddings": 10, "name": "t_user_id"}


def test_spec_from_dict_rejects_bad_input() -> None:
    good = spec_to_dict(FeatureSpec())
    with pytest.raises(ValueError, match="missing keys"):
        spec_from_dict({k: v for k, v in good.items() if k != "embedding_dim"})
    with pytest.raises(ValueError, match="unknown keys"):
        spec_from_dict({**good, "extra": 1})
    with pytest.raises(ValueError):
        spec_from_dict({**good, "embedding_dim": "64"})
    bad_tables = [dict(t) for t in good["tables"]]  # type: ignore[attr-defined]
    bad_tables[0]["feature"] = "nope"
    with pytest.raises(ValueError):
        spec_from_dict({**good, "tables": bad_tables})
    with pytest.raises(ValueError, match="dense_arch"):
        spec_from_dict({**good, "dense_arch": [10, 3]})


def test_feature_spec_validation() -> None:
    with pytest.raises(ValueError, match="in that order"):
        FeatureSpec(tables=FeatureSpec().tables[::-1])
    with pytest.raises(ValueError, match="over_arch"):
        dataclasses.replace(FeatureSpec(), over_arch=(8, 2))
