"""EventColumns keeps every column aligned through slice, take, concat and a revocation, and
DecodedMessages turns accepted events into rejections in their messages' places."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.columns import EVENT_COLUMNS, EventColumns, FieldColumns
from pipeline.connectors.avro.reference import records_to_columns
from pipeline.types import DecodedMessages, RejectedMessage, RejectReason
from tests.pipeline.fakes import FakeMessage, polled

_event = st.tuples(
    st.integers(0, 10**6),  # user id
    st.lists(st.integers(0, 10**6), max_size=5),  # candidates
    st.lists(st.integers(0, 10**6), max_size=3),  # recent items
    st.booleans(),  # retrieved
)


def _columns(events: list[tuple[int, list[int], list[int], bool]]) -> EventColumns:
    records: list[dict[str, Any]] = [
        {
            "event_id": f"ev-{i}-{'é' * (i % 3)}",
            "user_id": user,
            "event_time": 1_700_000_000_000 + i,
            "context": {"device": f"d{i % 2}", "country": "DE"},
            "candidate_item_ids": candidates,
            "recent_item_ids": recent,
            "num_results": 1 + i % 4,
        }
        for i, (user, candidates, recent, _) in enumerate(events)
    ]
    columns = records_to_columns(records)
    columns.retrieved = np.array([r for *_, r in events], dtype=bool)
    return columns


def _rows(columns: EventColumns) -> list[tuple[Any, ...]]:
    """One tuple per event with every column's value (jagged ones as lists)."""
    cand = np.split(columns.candidate_ids, np.cumsum(columns.candidate_counts)[:-1])
    recent = np.split(columns.recent_ids, np.cumsum(columns.recent_counts)[:-1])
    per_event = [getattr(columns, name).tolist() for name in EVENT_COLUMNS]
    return [
        (eid, *values, cand[i].tolist(), recent[i].tolist())
        for i, (eid, *values) in enumerate(zip(columns.event_ids(), *per_event, strict=True))
    ]


@settings(max_examples=150, deadline=None)
@given(st.lists(_event, min_size=1, max_size=8), st.data())
def test_slice_take_and_concat_keep_every_column_aligned(
    events: list[Any], data: st.DataObject
) -> None:
    columns = _columns(events)
    rows = _rows(columns)
    start = data.draw(st.integers(0, len(events)))
    stop = data.draw(st.integers(start, len(events)))
    assert _rows(columns.slice(start, stop)) == rows[start:stop]
    order = data.draw(st.lists(st.integers(0, len(events) - 1), max_size=10))
    assert _rows(columns.take(np.asarray(order, dtype=np.int64))) == [rows[i] for i in order]
    cut = data.draw(st.integers(0, len(events)))
    joined = EventColumns.concat([columns.slice(0, cut), columns.slice(cut)])
    assert _rows(joined) == rows
    assert joined.retrieved.dtype == np.bool_


@settings(max_examples=100, deadline=None)
@given(st.lists(_event, min_size=1, max_size=8), st.data())
def test_rejecting_events_and_dropping_partitions_keep_messages_in_order(
    events: list[Any], data: st.DataObject
) -> None:
    columns = _columns(events)
    rows = _rows(columns)
    n = len(events)
    # Message i holds event i; every third message has a partition of its own.
    messages = polled([FakeMessage("in", b"x", i % 3, i) for i in range(n)])
    decoded = DecodedMessages(
        messages,
        columns,
        np.arange(n, dtype=np.int64),
        [],
    )
    which = sorted(data.draw(st.sets(st.integers(0, n - 1))))
    rejection = RejectedMessage(RejectReason.NO_CANDIDATES, "none found")
    rejected = decoded.reject_events(np.asarray(which, dtype=np.int64), rejection)
    kept = [i for i in range(n) if i not in which]
    assert len(rejected) == n  # every message stays, in order
    assert rejected.event_message.tolist() == kept
    assert _rows(rejected.events) == [rows[i] for i in kept]
    assert [(i, r.reason) for i, r in rejected.rejections] == [
        (i, RejectReason.NO_CANDIDATES) for i in which
    ]
    gone = data.draw(st.sets(st.integers(0, 2)))
    left = rejected.without_partitions({("in", p) for p in gone} | {("other", 0)})
    survivors = [i for i in kept if i % 3 not in gone]
    assert _rows(left.events) == [rows[i] for i in survivors]
    assert left.offsets[left.event_message].tolist() == survivors  # message i has offset i
    head, tail = rejected.split(min(1, len(kept)))
    assert len(head) + len(tail) == n


def test_list_weights_stay_beside_their_ids_and_weigh_one_where_there_are_none() -> None:
    weighted = FieldColumns.empty(3, lists=2)
    weighted.list_counts[:] = [[2, 1], [0, 1], [1, 0]]
    weighted.list_ids = np.array([1, 2, 3, 4, 5])
    weighted.list_weights = np.array([0.5, 1.5, 2.5, 3.5, 4.5], dtype=np.float32)
    assert weighted.slice(1, 3).list_weights.tolist() == [3.5, 4.5]  # type: ignore[union-attr]
    taken = weighted.take(np.array([2, 0]))
    assert taken.list_ids.tolist() == [5, 1, 2, 3]
    assert taken.list_weights.tolist() == [4.5, 0.5, 1.5, 2.5]  # type: ignore[union-attr]
    plain = FieldColumns.empty(1, lists=2)
    plain.list_counts[:] = [[1, 1]]
    plain.list_ids = np.array([8, 9])
    assert plain.list_weights is None and plain.weights().tolist() == [1.0, 1.0]
    joined = FieldColumns.concat([plain, weighted])
    assert joined.list_weights.tolist() == [1.0, 1.0, 0.5, 1.5, 2.5, 3.5, 4.5]  # type: ignore[union-attr]
    assert FieldColumns.concat([plain, plain]).list_weights is None
