"""``records_to_columns``: decoded UserEvent records -> the decode stage's columns."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import numpy as np

from model.features.spec import string_to_id
from pipeline.connectors.avro.reference import records_to_columns

EventFactory = Callable[..., dict[str, Any]]


def _record(make_event: EventFactory, i: int, **fields: Any) -> dict[str, Any]:
    return make_event(event_id=f"e{i}", **fields)


class TestRecordsToColumns:
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
        cols = records_to_columns(records)
        assert cols.num_events == 3
        assert cols.num_rows == 6
        assert cols.event_ids() == ["e0", "e1", "e2"]
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
        for name in ("user_ids", "candidate_ids", "recent_ids", "event_time_ms", "num_results"):
            assert getattr(cols, name).dtype == np.int64, name

    def test_event_time_int_millis_passthrough(self, make_event: EventFactory) -> None:
        cols = records_to_columns([make_event(event_time=1_700_000_000_123)])
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
        cols = records_to_columns(records)
        wrong = [
            (ms, got)
            for ms, got in zip(millis, cols.event_time_ms.tolist(), strict=True)
            if ms != got
        ]
        assert not wrong, f"{len(wrong)} of {len(millis)} off, e.g. {wrong[:3]}"

    def test_event_time_from_decoded_record(self, make_event: EventFactory) -> None:
        from pipeline.connectors.avro.reference import (
            USER_EVENT_SCHEMA_FILE,
            RecordCodec,
            ReferenceDecoder,
        )
        from pipeline.settings.codec import CodecSettings

        codec = RecordCodec(CodecSettings(), USER_EVENT_SCHEMA_FILE, "t")
        decoder = ReferenceDecoder(CodecSettings(), recent_cap=20)
        record = decoder.decode(codec.encode(make_event(event_time=1_715_949_045_123)))
        assert records_to_columns([record]).event_time_ms.tolist() == [1_715_949_045_123]

    def test_single_event(self, make_event: EventFactory) -> None:
        cols = records_to_columns([make_event(candidate_item_ids=[9])])
        assert cols.num_events == 1
        assert cols.candidate_ids.tolist() == [9]
        assert cols.candidate_counts.tolist() == [1]
