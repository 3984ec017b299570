"""The mapped features: each key's ids from its source, through its transform, one bag per row;
what each key's ``missing`` policy gives where a value is absent (null, or a Redis record or
field missing or malformed); the dense parts side by side, defaults where null or missing."""

from __future__ import annotations

import numpy as np
import pytest

from model.features.mapping import DensePart, FeatureMap, Missing, SparseKey, Store
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
        int_present=np.ones((2, 1), dtype=bool),
        list_present=np.ones((2, 1), dtype=bool),
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
    """The second event's user has no record (every field absent)."""
    user = FieldColumns(
        ints=np.array([[3], [0]]),
        floats=np.array([[1.0, 2.0], [np.nan, np.nan]], dtype=np.float32),
        list_counts=np.zeros((2, 0), dtype=np.int64),
        list_ids=np.zeros(0, dtype=np.int64),
        int_present=np.array([[True], [False]]),
        list_present=np.zeros((2, 0), dtype=bool),
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
    assert sparse["u"].lengths().tolist() == [1, 1, 0]  # no record: an empty bag
    assert sparse["u"].values().tolist() == [3, 3]
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


def _with_misses() -> tuple[EventColumns, Enrichment]:
    """Three events (1, 2 and 1 candidates) and their users and items, each source with an
    absent value somewhere:

    - event: a nullable id (null for event 1) and a nullable id list (null for event 2, empty
      for event 0);
    - user: an id field (absent for event 1's user), an id list (event 2's user has no record:
      absent, event 0's holds 2 ids, shorter than its cap of 4);
    - item: an id field (absent for the last row's item).
    """
    events = _events().take(np.array([0, 1, 1]))
    events.candidate_counts = np.array([1, 2, 1])
    events.candidate_ids = np.array([100, 101, 102, 103])
    events.fields = FieldColumns(
        ints=np.zeros((3, 0), dtype=np.int64),
        floats=np.zeros((3, 0), dtype=np.float32),
        list_counts=np.array([[1, 0], [0, 3], [1, 0]], dtype=np.int64),
        list_ids=np.array([5, 31, 32, 33, 6], dtype=np.int64),
        int_present=np.zeros((3, 0), dtype=bool),
        list_present=np.array([[True, True], [False, True], [True, False]]),
    )
    users = FieldColumns(
        ints=np.array([[7], [0], [8]], dtype=np.int64),
        floats=np.array([[1.0], [2.0], [np.nan]], dtype=np.float32),
        list_counts=np.array([[2], [1], [0]], dtype=np.int64),
        list_ids=np.array([41, 42, 43], dtype=np.int64),
        int_present=np.array([[True], [False], [True]]),
        list_present=np.array([[True], [True], [False]]),
    )
    items = FieldColumns.empty(4, ints=1, floats=1)
    items.ints[:, 0] = [50, 51, 52, 0]
    items.int_present[3, 0] = False
    items.floats[3, 0] = np.nan
    enrichment = _enrichment()
    enrichment.user_fields, enrichment.item_fields = users, items
    return events, enrichment


def _policy_map(missing: Missing, missing_row: int = 0, missing_id: int = 0) -> FeatureMap:
    def key(name: str, source: Source, store: Store, column: int, max_ids: int = 1) -> SparseKey:
        return SparseKey(
            name, source, store, column, Transform.MODULO, 10, max_ids=max_ids,
            missing=missing, missing_row=missing_row, missing_id=missing_id,
        )  # fmt: skip

    return FeatureMap(
        None, "", None, (), None, None,  # type: ignore[arg-type]
        (
            key("event_id", Source.EVENT, Store.LISTS, 0),
            key("event_list", Source.EVENT, Store.LISTS, 1, max_ids=3),
            key("user_id", Source.USER, Store.INTS, 0),
            key("user_list", Source.USER, Store.LISTS, 0, max_ids=4),
            key("item_id", Source.ITEM, Store.INTS, 0),
        ),
        (
            DensePart("user.v", Source.USER, 0, 1, default=-1.0),
            DensePart("item.s", Source.ITEM, 0, 1, default=-2.0),
        ),
    )  # fmt: skip


def _bags(missing: Missing, missing_row: int = 0, missing_id: int = 0) -> dict[str, list]:
    events, enrichment = _with_misses()
    inp = MappedFeatures(_policy_map(missing, missing_row, missing_id)).build(events, enrichment)
    out = {}
    for name, jagged in inp.sparse.to_dict().items():
        values, lengths = jagged.values().tolist(), jagged.lengths().tolist()
        ends = np.cumsum(lengths).tolist()
        out[name] = [values[e - n : e] for e, n in zip(ends, lengths, strict=True)]
    out["dense"] = inp.dense.tolist()
    return out


def test_a_missing_value_is_an_empty_bag_by_default() -> None:
    bags = _bags(Missing.EMPTY)
    assert bags["event_id"] == [[5], [], [], [6]]  # null for event 1 (rows 1, 2)
    assert bags["event_list"] == [[], [1, 2, 3], [1, 2, 3], []]  # [] and null: both no ids
    assert bags["user_id"] == [[7], [], [], [8]]
    assert bags["user_list"] == [[1, 2], [3], [3], []]  # a short list is a short bag
    assert bags["item_id"] == [[0], [1], [2], []]
    assert bags["dense"] == [[1.0, 0.0], [2.0, 0.0], [2.0, 0.0], [-1.0, -2.0]]


def test_a_missing_value_can_be_a_fixed_row() -> None:
    bags = _bags(Missing.ROW, missing_row=9)
    assert bags["event_id"] == [[5], [9], [9], [6]]
    assert bags["event_list"] == [[], [1, 2, 3], [1, 2, 3], [9]]  # an empty list is no miss
    assert bags["user_id"] == [[7], [9], [9], [8]]
    assert bags["user_list"] == [[1, 2], [3], [3], [9]]
    assert bags["item_id"] == [[0], [1], [2], [9]]


def test_a_missing_value_can_be_a_raw_id_through_the_transform() -> None:
    bags = _bags(Missing.ID, missing_id=-3)  # modulo 10: row 7
    assert bags["event_id"] == [[5], [7], [7], [6]]
    assert bags["event_list"] == [[], [1, 2, 3], [1, 2, 3], [7]]
    assert bags["user_id"] == [[7], [7], [7], [8]]
    assert bags["user_list"] == [[1, 2], [3], [3], [7]]
    assert bags["item_id"] == [[0], [1], [2], [7]]
    hashed = SparseKey(
        "k", Source.USER, Store.INTS, 0, Transform.HASH, 50, salt=9,
        missing=Missing.ID, missing_id=123,
    )  # fmt: skip
    fmap = FeatureMap(
        None, "", None, (), None, None, (hashed,), (DensePart("user.v", Source.USER, 0, 1),)
    )  # type: ignore[arg-type]
    events, enrichment = _with_misses()
    got = MappedFeatures(fmap).build(events, enrichment).sparse.to_dict()["k"]
    row = hash_to_rows(np.array([123]), 50, 9)[0]
    assert got.values().tolist() == hash_to_rows(np.array([7, 123, 123, 8]), 50, 9).tolist()
    assert got.values().tolist()[1] == row


def test_weighted_keys_carry_their_weights_and_every_other_id_weighs_one() -> None:
    events = _events()
    assert events.fields is not None
    events.fields.list_weights = np.array([0.5, 2.0, 4.0], dtype=np.float32)
    events.fields.list_present[1, 0] = False  # the second event's list: missing (row 9)
    weighted = SparseKey(
        "l", Source.EVENT, Store.LISTS, 0, Transform.MODULO, 50, max_ids=3,
        missing=Missing.ROW, missing_row=9, weighted=True,
    )  # fmt: skip
    keys = (
        _key("e", Source.EVENT, Store.INTS, Transform.MODULO, 10),
        weighted,
        _key("c", Source.CANDIDATE, Store.INTS, Transform.IDENTITY, 101),
    )
    dense = (DensePart("event.x", Source.EVENT, 0, 1),)
    fmap = FeatureMap(None, "", None, (), None, None, keys, dense, weighted=True)  # type: ignore[arg-type]
    inp = MappedFeatures(fmap).build(events, _enrichment())
    sparse = inp.sparse.to_dict()
    assert sparse["l"].values().tolist() == [21, 22, 21, 22, 9]
    assert sparse["l"].weights().tolist() == [0.5, 2.0, 0.5, 2.0, 1.0]  # the policy's row: 1.0
    assert sparse["e"].weights().tolist() == [1.0] * 3
    assert sparse["c"].weights().tolist() == [1.0] * 3
    unweighted = FeatureMap(None, "", None, (), None, None, keys, dense)  # type: ignore[arg-type]
    assert MappedFeatures(unweighted).build(events, _enrichment()).sparse.weights_or_none() is None
