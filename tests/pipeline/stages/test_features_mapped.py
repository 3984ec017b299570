"""The mapped features: each key's ids from its source, through its transform, one bag per row;
the dense parts side by side, defaults where null or missing."""

from __future__ import annotations

import numpy as np
import pytest

from model.features.mapping import DensePart, FeatureMap, SparseKey, Store
from model.features.spec import hash_to_rows
from pipeline.columns import EventColumns, FieldColumns
from pipeline.settings.features import Source, Transform
from pipeline.stages.features.mapped import MappedFeatures, table_rows
from pipeline.types import Enrichment


def _events() -> EventColumns:
    """Two events: 2 and 1 candidates; an id, a number (null for the second), an id list."""
    fields = FieldColumns(
        ints=np.array([[13], [-7]], dtype=np.int64),
        floats=np.array([[0.5], [np.nan]], dtype=np.float32),
        list_counts=np.array([[2], [1]], dtype=np.int64),
        list_ids=np.array([21, 22, 23], dtype=np.int64),
    )
    zeros = np.zeros(2, dtype=np.int64)
    return EventColumns(
        event_id_bytes=np.frombuffer(b"ab", dtype=np.uint8),
        event_id_offsets=np.array([0, 1, 2]),
        user_ids=np.array([1, 2]),
        event_time_ms=zeros,
        device_ids=zeros,
        country_ids=zeros,
        num_results=np.array([1, 1]),
        candidate_counts=np.array([2, 1]),
        candidate_ids=np.array([100, 101, 102]),
        recent_counts=zeros,
        recent_ids=np.zeros(0, dtype=np.int64),
        retrieved=np.zeros(2, dtype=bool),
        fields=fields,
    )


def _enrichment() -> Enrichment:
    user = FieldColumns(
        ints=np.array([[3], [0]]),
        floats=np.array([[1.0, 2.0], [0.0, 0.0]], dtype=np.float32),
        list_counts=np.zeros((2, 0), dtype=np.int64),
        list_ids=np.zeros(0, dtype=np.int64),
    )
    item = FieldColumns.empty(3, ints=1, floats=1)
    item.ints[:, 0] = [40, 41, 42]
    item.floats[:, 0] = [0.1, 0.2, 0.0]
    return Enrichment(
        user_dense=np.zeros((2, 0), dtype=np.float32),
        user_recent_counts=np.zeros(2, dtype=np.int64),
        user_recent_ids=np.zeros(0, dtype=np.int64),
        user_missing=np.array([False, True]),
        item_category=np.zeros(3, dtype=np.int64),
        item_dense=np.zeros((3, 0), dtype=np.float32),
        item_missing=np.array([False, False, True]),
        user_fields=user,
        item_fields=item,
    )


def _key(name: str, source: Source, store: Store, transform: Transform, rows: int) -> SparseKey:
    return SparseKey(name, source, store, 0, transform, rows, default_row=1, salt=9, max_ids=3)


def test_each_key_and_dense_part_comes_from_its_source() -> None:
    fmap = FeatureMap(
        None, "", None, (), None, None,  # type: ignore[arg-type]
        (
            _key("e", Source.EVENT, Store.INTS, Transform.MODULO, 10),
            _key("l", Source.EVENT, Store.LISTS, Transform.HASH, 50),
            _key("c", Source.CANDIDATE, Store.INTS, Transform.IDENTITY, 101),
            _key("u", Source.USER, Store.INTS, Transform.IDENTITY, 4),
            _key("i", Source.ITEM, Store.INTS, Transform.MODULO, 8),
        ),
        (
            DensePart("event.x", Source.EVENT, 0, 1, default=-1.0),
            DensePart("user.v", Source.USER, 0, 2, default=9.0),
            DensePart("item.s", Source.ITEM, 0, 1),
        ),
    )  # fmt: skip
    inp = MappedFeatures(fmap).build(_events(), _enrichment())
    sparse = inp.sparse.to_dict()
    assert inp.sparse.keys() == ["e", "l", "c", "u", "i"]
    assert sparse["e"].values().tolist() == [3, 3, 3]  # 13 % 10 for both rows; -7 % 10
    assert sparse["e"].values().tolist()[:2] == [13 % 10] * 2
    hashed = hash_to_rows(np.array([21, 22, 23]), 50, 9).tolist()
    assert sparse["l"].lengths().tolist() == [2, 2, 1]
    assert sparse["l"].values().tolist() == hashed[:2] * 2 + hashed[2:]
    assert sparse["c"].values().tolist() == [100, 1, 1]  # identity: outside rows -> row 1
    assert sparse["u"].values().tolist() == [3, 3, 0]
    assert sparse["i"].values().tolist() == [0, 1, 2]  # 40, 41, 42 mod 8
    assert inp.dense.tolist() == [
        [0.5, 1.0, 2.0, pytest.approx(0.1)],
        [0.5, 1.0, 2.0, pytest.approx(0.2)],
        [-1.0, 9.0, 9.0, 0.0],  # null number, missing user: the parts' defaults
    ]


def test_transforms() -> None:
    ids = np.array([-3, 0, 9, 12])
    identity = SparseKey("k", Source.EVENT, Store.INTS, 0, Transform.IDENTITY, 10, default_row=4)
    assert table_rows(ids, identity).tolist() == [4, 0, 9, 4]
    modulo = SparseKey("k", Source.EVENT, Store.INTS, 0, Transform.MODULO, 10)
    assert table_rows(ids, modulo).tolist() == [7, 0, 9, 2]
    hashed = SparseKey("k", Source.EVENT, Store.INTS, 0, Transform.HASH, 10, salt=3)
    assert table_rows(ids, hashed).tolist() == hash_to_rows(ids, 10, 3).tolist()
