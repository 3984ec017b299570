"""MicroBatcher semantics and to_columns correctness."""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from model.spec import string_to_id
from pipeline.stages import batch as batch_mod
from pipeline.stages.batch import (
    ARRAY_FIELDS,
    EventColumns,
    MicroBatcher,
    categorical_id,
    to_columns,
)

EventFactory = Callable[..., dict[str, Any]]


def _event(n_candidates: int, i: int = 0) -> dict[str, Any]:
    return {
        "event_id": f"e{i}",
        "user_id": i,
        "event_time": 0,
        "context": {"device": "ios", "country": "DE"},
        "candidate_item_ids": list(range(i * 100, i * 100 + n_candidates)),
        "recent_item_ids": [],
        "num_results": 1,
    }


def _cols(*events: dict[str, Any]) -> EventColumns:
    return to_columns(list(events))


def _src(n: int) -> list[tuple[str, int]]:
    return [("t", 0)] * n


def _drive(batcher: MicroBatcher, events: list[dict[str, Any]]) -> list[list[str]]:
    """The loop's use: add what fits of the rest, hold when some does not, close when ready."""
    batches: list[list[str]] = []
    rest = _cols(*events)
    while rest.num_events:
        fit = batcher.room(rest.candidate_counts)
        batcher.add(rest.head(fit), _src(fit), now=0.0)
        if fit < rest.num_events:
            batcher.hold()
        rest = rest.take(np.arange(fit, rest.num_events))
        if batcher.ready(now=0.0):
            closed = batcher.close()
            assert closed is not None
            batches.append(closed.event_ids)
    last = batcher.close()
    if last is not None:
        batches.append(last.event_ids)
    return batches


class TestMicroBatcher:
    def test_empty(self) -> None:
        batcher = MicroBatcher(max_rows=10, max_delay_ms=20)
        assert len(batcher) == 0
        assert batcher.rows == 0
        assert not batcher.full
        assert not batcher.due(now=1e9)
        assert batcher.time_left(now=0.0) == math.inf
        assert batcher.close() is None

    def test_add_counts_rows_and_events(self) -> None:
        batcher = MicroBatcher(max_rows=10, max_delay_ms=20)
        batcher.add(_cols(_event(3), _event(4, 1)), _src(2), now=0.0)
        assert len(batcher) == 2
        assert batcher.rows == 7
        assert not batcher.full

    def test_room_boundary(self) -> None:
        batcher = MicroBatcher(max_rows=10, max_delay_ms=20)
        batcher.add(_cols(_event(6)), _src(1), now=0.0)
        assert batcher.room(np.array([4, 1])) == 1
        assert batcher.room(np.array([3, 1, 1])) == 2
        assert batcher.room(np.array([5])) == 0

    def test_full_at_exactly_max_rows(self) -> None:
        batcher = MicroBatcher(max_rows=10, max_delay_ms=20)
        batcher.add(_cols(_event(6)), _src(1), now=0.0)
        assert not batcher.full
        batcher.add(_cols(_event(4, 1)), _src(1), now=0.0)
        assert batcher.full

    def test_empty_batch_accepts_oversized_event(self) -> None:
        batcher = MicroBatcher(max_rows=4, max_delay_ms=20)
        assert batcher.room(np.array([9, 1])) == 1
        batcher.add(_cols(_event(9)), _src(1), now=0.0)
        assert batcher.full
        assert batcher.room(np.array([1])) == 0

    def test_hold_completes_the_batch_until_close(self) -> None:
        batcher = MicroBatcher(max_rows=10, max_delay_ms=1000)
        batcher.add(_cols(_event(6)), _src(1), now=0.0)
        batcher.hold()
        assert batcher.holding and batcher.ready(now=0.0)
        assert batcher.room(np.array([1])) == 0
        batcher.close()
        assert not batcher.holding

    def test_oversized_event_forms_its_own_batch(self) -> None:
        events = [_event(2, 0), _event(9, 1), _event(2, 2)]
        batches = _drive(MicroBatcher(max_rows=4, max_delay_ms=20), events)
        assert batches == [["e0"], ["e1"], ["e2"]]

    def test_event_never_split_and_rows_bounded(self) -> None:
        sizes = [3, 5, 1, 7, 2, 2, 8, 1, 1, 1, 6, 4]
        events = [_event(n, i) for i, n in enumerate(sizes)]
        max_rows = 8
        batches = _drive(MicroBatcher(max_rows=max_rows, max_delay_ms=20), events)
        assert [e for b in batches for e in b] == [e["event_id"] for e in events]
        rows = [[sizes[int(e[1:])] for e in b] for b in batches]
        for b in rows:
            assert sum(b) <= max_rows or len(b) == 1
        # Greedy packing: a batch closes only when the next event would not fit.
        for b, nxt in itertools.pairwise(rows):
            assert sum(b) == max_rows or sum(b) + nxt[0] > max_rows

    def test_max_rows_one_gives_one_event_per_batch(self) -> None:
        events = [_event(n, i) for i, n in enumerate([1, 3, 1, 2])]
        batches = _drive(MicroBatcher(max_rows=1, max_delay_ms=20), events)
        assert batches == [[e["event_id"]] for e in events]

    def test_close_returns_the_columns_and_resets(self) -> None:
        batcher = MicroBatcher(max_rows=10, max_delay_ms=20)
        batcher.add(_cols(_event(4)), _src(1), now=0.0)
        batcher.add(_cols(_event(6, 1)), _src(1), now=0.0)
        closed = batcher.close()
        assert closed is not None and closed.event_ids == ["e0", "e1"]
        assert closed.candidate_ids.tolist() == [0, 1, 2, 3, *range(100, 106)]
        assert len(batcher) == 0
        assert batcher.rows == 0
        assert batcher.close() is None
        assert batcher.room(np.array([10])) == 1

    def test_drop_partitions_keeps_the_other_events(self) -> None:
        batcher = MicroBatcher(max_rows=100, max_delay_ms=20)
        batcher.add(_cols(_event(2), _event(3, 1), _event(4, 2)), [("t", 0), ("t", 1), ("t", 0)])
        assert batcher.drop_partitions({("t", 0)}) == 2
        assert batcher.rows == 3
        closed = batcher.close()
        assert closed is not None and closed.candidate_ids.tolist() == [100, 101, 102]

    def test_delay_uses_now_argument(self) -> None:
        batcher = MicroBatcher(max_rows=100, max_delay_ms=20)
        batcher.add(_cols(_event(1)), _src(1), now=1000.0)
        assert batcher.time_left(now=1000.0) == pytest.approx(0.020)
        assert batcher.time_left(now=1000.015) == pytest.approx(0.005)
        assert not batcher.due(now=1000.019)
        assert batcher.due(now=1000.020)
        assert batcher.due(now=1000.5)
        assert batcher.time_left(now=1000.5) == 0.0

    def test_delay_measured_from_oldest_event(self) -> None:
        batcher = MicroBatcher(max_rows=100, max_delay_ms=50)
        batcher.add(_cols(_event(1, 0)), _src(1), now=10.0)
        batcher.add(
            _cols(_event(1, 1)), _src(1), now=10.04
        )  # a later event does not restart the clock
        assert batcher.time_left(now=10.04) == pytest.approx(0.01)
        assert batcher.due(now=10.05)

    def test_clock_restarts_after_close(self) -> None:
        batcher = MicroBatcher(max_rows=100, max_delay_ms=20)
        batcher.add(_cols(_event(1)), _src(1), now=0.0)
        batcher.close()
        batcher.add(_cols(_event(1)), _src(1), now=5.0)
        assert not batcher.due(now=5.01)
        assert batcher.time_left(now=5.0) == pytest.approx(0.02)

    def test_default_clock_is_monotonic(self, monkeypatch: pytest.MonkeyPatch) -> None:
        clock = [100.0]
        monkeypatch.setattr(batch_mod.time, "monotonic", lambda: clock[0])
        batcher = MicroBatcher(max_rows=100, max_delay_ms=20)
        batcher.add(_cols(_event(1)), _src(1))
        assert not batcher.due()
        clock[0] = 100.021
        assert batcher.due()


def _record(make_event: EventFactory, i: int, **fields: Any) -> dict[str, Any]:
    return make_event(event_id=f"e{i}", **fields)


class TestToColumns:
    def test_columns_match_records(self, make_event: EventFactory) -> None:
        t0 = dt.datetime(2024, 1, 2, 3, 4, 5, 678_000, tzinfo=dt.UTC)
        records = [
            _record(
                make_event,
                0,
                user_id=5,
                candidate_item_ids=[10, 11, 12],
                recent_item_ids=[1],
                num_results=2,
                context={"device": "ios", "country": "DE"},
                event_time=t0,
            ),
            _record(
                make_event,
                1,
                user_id=2**62,
                candidate_item_ids=[20],
                recent_item_ids=[],
                num_results=1,
                context={"device": "android", "country": "FR"},
                event_time=t0 + dt.timedelta(milliseconds=1),
            ),
            _record(
                make_event,
                2,
                user_id=0,
                candidate_item_ids=[30, 31],
                recent_item_ids=[3, 4, 5],
                num_results=7,
                context={"device": "web", "country": "DE"},
                event_time=t0 + dt.timedelta(seconds=1),
            ),
        ]
        cols = to_columns(records)
        assert cols.num_events == 3
        assert cols.num_rows == 6
        assert cols.event_ids == ["e0", "e1", "e2"]
        np.testing.assert_array_equal(cols.user_ids, [5, 2**62, 0])
        np.testing.assert_array_equal(cols.candidate_counts, [3, 1, 2])
        np.testing.assert_array_equal(cols.candidate_ids, [10, 11, 12, 20, 30, 31])
        np.testing.assert_array_equal(cols.num_results, [2, 1, 7])
        ms0 = 1_704_164_645_678
        np.testing.assert_array_equal(cols.event_time_ms, [ms0, ms0 + 1, ms0 + 1000])
        np.testing.assert_array_equal(
            cols.device_ids, [string_to_id("ios"), string_to_id("android"), string_to_id("web")]
        )
        np.testing.assert_array_equal(
            cols.country_ids, [string_to_id("DE"), string_to_id("FR"), string_to_id("DE")]
        )
        assert cols.recent_counts.tolist() == [1, 0, 3]
        assert cols.recent_ids.tolist() == [1, 3, 4, 5]
        for name in ARRAY_FIELDS:
            assert getattr(cols, name).dtype == np.int64, name

    def test_event_time_int_millis_passthrough(self, make_event: EventFactory) -> None:
        cols = to_columns([make_event(event_time=1_700_000_000_123)])
        assert cols.event_time_ms.tolist() == [1_700_000_000_123]

    def test_event_time_exact_for_every_millisecond(self, make_event: EventFactory) -> None:
        """Decoded ``timestamp-millis`` datetimes must map back to the exact epoch millis.

        ``int(datetime.timestamp() * 1000)`` truncates a float: e.g. 544098626540 ms comes back
        as 544098626539. These timestamps are chosen because the float path gets them wrong.
        """
        epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        millis = [544_098_626_540, 1_700_000_000_001, 1_715_948_445_123, 0, 1]
        rng = np.random.default_rng(7)
        millis += rng.integers(1_600_000_000_000, 1_800_000_000_000, 2000).tolist()
        records = [make_event(event_time=epoch + dt.timedelta(milliseconds=ms)) for ms in millis]
        cols = to_columns(records)
        wrong = [
            (ms, got)
            for ms, got in zip(millis, cols.event_time_ms.tolist(), strict=True)
            if ms != got
        ]
        assert not wrong, f"{len(wrong)} of {len(millis)} off, e.g. {wrong[:3]}"

    def test_event_time_from_decoded_record(self, make_event: EventFactory) -> None:
        from pipeline.config import CodecSettings
        from pipeline.stages.decode import USER_EVENT_SCHEMA_FILE, RecordCodec, UserEventDecoder

        codec = RecordCodec(CodecSettings(), USER_EVENT_SCHEMA_FILE, "t")
        decoder = UserEventDecoder(CodecSettings(), recent_cap=20)
        record = decoder.decode(codec.encode(make_event(event_time=1_715_949_045_123)))
        assert to_columns([record]).event_time_ms.tolist() == [1_715_949_045_123]

    def test_single_event(self, make_event: EventFactory) -> None:
        cols = to_columns([make_event(candidate_item_ids=[9])])
        assert cols.num_events == 1
        assert cols.candidate_ids.tolist() == [9]
        assert cols.candidate_counts.tolist() == [1]

    def test_categorical_id_cached_and_equal_to_spec(self) -> None:
        for value in ("ios", "android", "", "ünïcode"):
            assert categorical_id(value) == string_to_id(value)
            assert categorical_id(value) == string_to_id(value)  # cached path
