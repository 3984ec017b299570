"""MicroBatcher semantics: rows and delay bounds, admitting decoded messages in order."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from pipeline.connectors.avro.reference import records_to_columns
from pipeline.stages import batch as batch_mod
from pipeline.stages.batch import MicroBatcher
from pipeline.types import DecodedMessages, EventColumns, PolledBatch, RejectedMessage, RejectReason
from tests.pipeline.fakes import FakeMessage, polled


def _event(n_candidates: int, i: int = 0) -> dict[str, Any]:
    return {
        "event_id": f"e{i}",
        "user_id": i,
        "event_time": 1_700_000_000_000,
        "context": {"device": "ios", "country": "DE"},
        "candidate_item_ids": list(range(i * 100, i * 100 + n_candidates)),
        "recent_item_ids": [],
        "num_results": 1,
    }


def _cols(*events: dict[str, Any]) -> EventColumns:
    return records_to_columns(list(events))


def _src(n: int, partition: int = 0) -> PolledBatch:
    return polled([FakeMessage("t", None, partition, i) for i in range(n)])


def _decoded(events: list[dict[str, Any]], rejected: set[int] = frozenset()) -> DecodedMessages:  # type: ignore[assignment]
    """Messages in order: one per event, plus a rejected one before each index in
    ``rejected``."""
    messages: list[Any] = []
    event_message: list[int] = []
    rejections: list[tuple[int, RejectedMessage]] = []
    for i in range(len(events)):
        if i in rejected:
            rejections.append((len(messages), RejectedMessage(RejectReason.EMPTY, "x")))
            messages.append(FakeMessage("t", b"", 0, len(messages)))
        event_message.append(len(messages))
        messages.append(FakeMessage("t", b"v", 0, len(messages)))
    return DecodedMessages(
        polled(messages),
        _cols(*events),
        np.asarray(event_message, np.int64),
        rejections,
    )


def _drive(batcher: MicroBatcher, events: list[dict[str, Any]]) -> list[list[str]]:
    """The loop's use: queue decoded messages, admit what fits, close when ready."""
    batches: list[list[str]] = []
    batcher.queue(_decoded(events), arrived=0.0)
    while batcher.waiting:
        batcher.admit()
        if batcher.ready(now=0.0):
            closed = batcher.close()
            assert closed is not None
            batches.append(closed[0].event_ids())
    last = batcher.close()
    if last is not None:
        batches.append(last[0].event_ids())
    return batches


class TestMicroBatcher:
    def test_empty(self) -> None:
        batcher = MicroBatcher(max_batch_rows=10, max_delay_ms=20)
        assert len(batcher) == 0
        assert batcher.rows == 0
        assert not batcher.full
        assert not batcher.due(now=1e9)
        assert batcher.time_left(now=0.0) == math.inf
        assert batcher.close() is None

    def test_add_counts_rows_and_events(self) -> None:
        batcher = MicroBatcher(max_batch_rows=10, max_delay_ms=20)
        batcher.add(_cols(_event(3), _event(4, 1)), _src(2), now=0.0)
        assert len(batcher) == 2
        assert batcher.rows == 7
        assert not batcher.full

    def test_room_boundary(self) -> None:
        batcher = MicroBatcher(max_batch_rows=10, max_delay_ms=20)
        batcher.add(_cols(_event(6)), _src(1), now=0.0)
        assert batcher.room(np.array([4, 1])) == 1
        assert batcher.room(np.array([3, 1, 1])) == 2
        assert batcher.room(np.array([5])) == 0

    def test_full_at_exactly_max_rows(self) -> None:
        batcher = MicroBatcher(max_batch_rows=10, max_delay_ms=20)
        batcher.add(_cols(_event(6)), _src(1), now=0.0)
        assert not batcher.full
        batcher.add(_cols(_event(4, 1)), _src(1), now=0.0)
        assert batcher.full

    def test_empty_batch_accepts_oversized_event(self) -> None:
        batcher = MicroBatcher(max_batch_rows=4, max_delay_ms=20)
        assert batcher.room(np.array([9, 1])) == 1
        batcher.add(_cols(_event(9)), _src(1), now=0.0)
        assert batcher.full
        assert batcher.room(np.array([1])) == 0

    def test_an_event_that_does_not_fit_completes_the_batch_until_close(self) -> None:
        batcher = MicroBatcher(max_batch_rows=10, max_delay_ms=1000)
        batcher.queue(_decoded([_event(6), _event(5, 1)]), arrived=0.0)
        admitted = batcher.admit()
        assert admitted is not None and len(admitted) == 1
        assert batcher.is_complete and batcher.ready(now=0.0)
        assert batcher.room(np.array([1])) == 0
        assert batcher.admit() is None  # the waiting event waits for the next batch
        assert batcher.waiting == 1 and len(batcher) == 1
        batcher.close()
        assert not batcher.is_complete
        assert batcher.admit() is not None and batcher.waiting == 0

    def test_rejected_messages_are_admitted_in_order_with_the_events_around_them(self) -> None:
        batcher = MicroBatcher(max_batch_rows=10, max_delay_ms=1000)
        batcher.queue(
            _decoded([_event(6), _event(5, 1), _event(1, 2)], rejected={1, 2}), arrived=0.0
        )
        head = batcher.admit()
        # event 0, then the reject before event 1; event 1 does not fit: it waits
        assert head is not None and head.offsets.tolist() == [0, 1]
        assert [i for i, _ in head.rejections] == [1]
        batcher.close()
        rest = batcher.admit()
        assert rest is not None and rest.offsets.tolist() == [2, 3, 4]
        assert [i for i, _ in rest.rejections] == [1]  # offset 3, indexed within ``rest``
        closed = batcher.close()
        assert closed is not None and closed[0].event_ids() == ["e1", "e2"]

    def test_oversized_event_forms_its_own_batch(self) -> None:
        events = [_event(2, 0), _event(9, 1), _event(2, 2)]
        batches = _drive(MicroBatcher(max_batch_rows=4, max_delay_ms=20), events)
        assert batches == [["e0"], ["e1"], ["e2"]]

    def test_event_never_split_and_rows_bounded(self) -> None:
        sizes = [3, 5, 1, 7, 2, 2, 8, 1, 1, 1, 6, 4]
        events = [_event(n, i) for i, n in enumerate(sizes)]
        max_batch_rows = 8
        batches = _drive(MicroBatcher(max_batch_rows=max_batch_rows, max_delay_ms=20), events)
        assert [e for b in batches for e in b] == [e["event_id"] for e in events]
        rows = [[sizes[int(e[1:])] for e in b] for b in batches]
        for b in rows:
            assert sum(b) <= max_batch_rows or len(b) == 1
        # Greedy packing: a batch closes only when the next event would not fit.
        for b, nxt in itertools.pairwise(rows):
            assert sum(b) == max_batch_rows or sum(b) + nxt[0] > max_batch_rows

    def test_max_rows_one_gives_one_event_per_batch(self) -> None:
        events = [_event(n, i) for i, n in enumerate([1, 3, 1, 2])]
        batches = _drive(MicroBatcher(max_batch_rows=1, max_delay_ms=20), events)
        assert batches == [[e["event_id"]] for e in events]

    def test_close_returns_the_columns_and_resets(self) -> None:
        batcher = MicroBatcher(max_batch_rows=10, max_delay_ms=20)
        batcher.add(_cols(_event(4)), _src(1), now=0.0)
        batcher.add(_cols(_event(6, 1)), _src(1), now=0.0)
        closed = batcher.close()
        assert closed is not None and closed[0].event_ids() == ["e0", "e1"]
        assert closed[0].candidate_ids.tolist() == [0, 1, 2, 3, *range(100, 106)]
        assert len(closed[1]) == 2
        assert len(batcher) == 0
        assert batcher.rows == 0
        assert batcher.close() is None
        assert batcher.room(np.array([10])) == 1

    def test_drop_partitions_keeps_the_other_events(self) -> None:
        batcher = MicroBatcher(max_batch_rows=100, max_delay_ms=20)
        sources = PolledBatch.concat([_src(1, 0), _src(1, 1), _src(1, 0)])
        batcher.add(_cols(_event(2), _event(3, 1), _event(4, 2)), sources)
        assert batcher.drop_partitions({("t", 0)}) == 2
        assert batcher.rows == 3
        closed = batcher.close()
        assert closed is not None and closed[0].candidate_ids.tolist() == [100, 101, 102]

    def test_drop_partitions_drops_waiting_events_too(self) -> None:
        batcher = MicroBatcher(max_batch_rows=4, max_delay_ms=20)
        decoded = _decoded([_event(3), _event(3, 1), _event(3, 2)])
        decoded.partitions[:] = [0, 1, 0]
        batcher.queue(decoded, arrived=0.0)
        batcher.admit()
        assert batcher.waiting == 2
        assert batcher.drop_partitions({("t", 0)}) == 2  # the open event 0, the waiting event 2
        batcher.admit()
        closed = batcher.close()
        assert closed is not None and closed[0].event_ids() == ["e1"]

    def test_delay_uses_now_argument(self) -> None:
        batcher = MicroBatcher(max_batch_rows=100, max_delay_ms=20)
        batcher.add(_cols(_event(1)), _src(1), now=1000.0)
        assert batcher.time_left(now=1000.0) == pytest.approx(0.020)
        assert batcher.time_left(now=1000.015) == pytest.approx(0.005)
        assert not batcher.due(now=1000.019)
        assert batcher.due(now=1000.020)
        assert batcher.due(now=1000.5)
        assert batcher.time_left(now=1000.5) == 0.0

    def test_delay_measured_from_oldest_event(self) -> None:
        batcher = MicroBatcher(max_batch_rows=100, max_delay_ms=50)
        batcher.add(_cols(_event(1, 0)), _src(1), now=10.0)
        batcher.add(
            _cols(_event(1, 1)), _src(1), now=10.04
        )  # a later event does not restart the clock
        assert batcher.time_left(now=10.04) == pytest.approx(0.01)
        assert batcher.due(now=10.05)

    def test_clock_restarts_after_close(self) -> None:
        batcher = MicroBatcher(max_batch_rows=100, max_delay_ms=20)
        batcher.add(_cols(_event(1)), _src(1), now=0.0)
        batcher.close()
        batcher.add(_cols(_event(1)), _src(1), now=5.0)
        assert not batcher.due(now=5.01)
        assert batcher.time_left(now=5.0) == pytest.approx(0.02)

    def test_default_clock_is_monotonic(self, monkeypatch: pytest.MonkeyPatch) -> None:
        clock = [100.0]
        monkeypatch.setattr(batch_mod.time, "monotonic", lambda: clock[0])
        batcher = MicroBatcher(max_batch_rows=100, max_delay_ms=20)
        batcher.add(_cols(_event(1)), _src(1))
        assert not batcher.due()
        clock[0] = 100.021
        assert batcher.due()
