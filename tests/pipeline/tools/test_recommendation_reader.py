"""``streamrank consume``'s reader: records of a user's output schema made ready for JSON."""

from __future__ import annotations

import datetime
import decimal
import json
import uuid

from pipeline.tools.recommendation_reader import json_ready


def test_times_become_epoch_milliseconds_and_the_rest_plain_text() -> None:
    at = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)
    record = {
        "at": at,
        "local": at.replace(tzinfo=None),  # local-timestamp-millis: the wall clock
        "day": datetime.date(2026, 1, 2),
        "tod": datetime.time(3, 4, 5),
        "raw": b"\x00\xff",
        "price": decimal.Decimal("1.50"),
        "id": uuid.UUID(int=1),
        "nested": [{"at": at, "n": 3, "none": None}],
    }
    ready = json_ready(record)
    millis = 1_767_323_045_678
    assert ready == {
        "at": millis,
        "local": millis,
        "day": "2026-01-02",
        "tod": "03:04:05",
        "raw": "\x00\xff",
        "price": "1.50",
        "id": "00000000-0000-0000-0000-000000000001",
        "nested": [{"at": millis, "n": 3, "none": None}],
    }
    json.dumps(ready)  # nothing JSON cannot hold
