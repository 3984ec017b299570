"""The schemas evolve compatibly: records of the v1 schemas (tests/schemas/v1, the schemas
before retrieval) decode with the new ones and the other way round, in both framings.

- ``raw`` framing (schemaless Avro, no writer schema on the wire): a reader decodes with its
  own schema file as the writer schema, so the byte layout must not change where old and new
  meet. UserEvent's layout is unchanged (an empty ``candidate_item_ids`` now means "retrieve");
  Recommendation gains ``retrieved`` as its last field, which readers of v1 never reach.
- ``confluent`` framing: the writer schema comes from the registry and is resolved against the
  reader's, so added fields with defaults are filled in or skipped.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import to_parsing_canonical_form

REPO = Path(__file__).resolve().parents[2]
V1 = Path(__file__).resolve().parent / "v1"
EVENT_V1 = fastavro.parse_schema(json.loads((V1 / "user_event.avsc").read_text()))
EVENT_NEW = fastavro.parse_schema(json.loads((REPO / "schemas/user_event.avsc").read_text()))
REC_V1 = fastavro.parse_schema(json.loads((V1 / "recommendation.avsc").read_text()))
REC_NEW_PATH = REPO / "schemas/recommendation.avsc"
REC_NEW = fastavro.parse_schema(json.loads(REC_NEW_PATH.read_text()))

EVENT: dict[str, Any] = {
    "event_id": "e-1",
    "user_id": 10**12 + 7919,
    "event_time": 1_700_000_000_000,
    "context": {"device": "ios", "country": "DE"},
    "candidate_item_ids": [5, 6, 7],
    "recent_item_ids": [3],
    "num_results": 2,
}
RECOMMENDATION: dict[str, Any] = {
    "event_id": "e-1",
    "user_id": 10**12 + 7919,
    "items": [{"item_id": 6, "score": 0.75}, {"item_id": 5, "score": 0.5}],
    "model_version": "dlrm-20250101-1a2b3c4d",
    "scored_at": 1_700_000_000_100,
    "fallback_features": ["item_features"],
}


def _write(schema: Any, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, record)
    return buf.getvalue()


def _read(data: bytes, writer: Any, reader: Any = None) -> dict[str, Any]:
    buf = io.BytesIO(data)
    record = fastavro.schemaless_reader(buf, writer, reader)
    assert buf.tell() == len(data), "bytes left over"
    assert isinstance(record, dict)
    return record


def _without_millis_types(record: dict[str, Any]) -> dict[str, Any]:
    """timestamp-millis fields come back as datetimes: compare them as epoch milliseconds."""
    out = dict(record)
    for name in ("event_time", "scored_at"):
        if name in out and not isinstance(out[name], int):
            out[name] = int(out[name].timestamp() * 1000)
    return out


@pytest.mark.parametrize("candidates", [[5, 6, 7], []])
def test_an_old_user_event_decodes_with_the_new_schema(candidates: list[int]) -> None:
    event = {**EVENT, "candidate_item_ids": candidates}
    old_bytes = _write(EVENT_V1, event)
    assert _write(EVENT_NEW, event) == old_bytes  # same bytes: raw framing is unaffected
    raw = _read(old_bytes, EVENT_NEW)  # raw framing: our file is the writer schema
    resolved = _read(old_bytes, EVENT_V1, EVENT_NEW)  # confluent framing: v1 writer resolved
    for record in (raw, resolved):
        assert _without_millis_types(record) == event
        assert record["candidate_item_ids"] == candidates  # [] now means "retrieve"


def test_the_user_event_byte_layout_is_unchanged() -> None:
    # Parsing Canonical Form drops docs and defaults: equal forms, equal binary encoding, so
    # the columnar decode kernel (pipeline/stages/avro_kernels.py) reads both.
    assert to_parsing_canonical_form(EVENT_NEW) == to_parsing_canonical_form(EVENT_V1)


def test_a_new_producer_may_leave_the_candidates_out() -> None:
    event = {k: v for k, v in EVENT.items() if k != "candidate_item_ids"}
    data = _write(EVENT_NEW, event)  # the default [] is written
    assert _read(data, EVENT_V1)["candidate_item_ids"] == []  # an old pipeline: no_candidates
    writer_without = json.loads((REPO / "schemas/user_event.avsc").read_text())
    writer_without["fields"] = [
        f for f in writer_without["fields"] if f["name"] != "candidate_item_ids"
    ]
    data = _write(fastavro.parse_schema(writer_without), event)
    assert (
        _read(data, fastavro.parse_schema(writer_without), EVENT_NEW)["candidate_item_ids"] == []
    )  # a registry writer schema without the field resolves to the default


def test_a_new_recommendation_is_read_by_old_consumers() -> None:
    rec = {**RECOMMENDATION, "retrieved": True}
    new_bytes = _write(REC_NEW, rec)
    assert new_bytes[:-1] == _write(REC_V1, RECOMMENDATION)  # v1 layout, then one boolean
    assert new_bytes[-1:] == b"\x01"
    raw_old_reader = fastavro.schemaless_reader(io.BytesIO(new_bytes), REC_V1, None)
    assert _without_millis_types(raw_old_reader) == RECOMMENDATION  # the last byte is unread
    resolved = _read(new_bytes, REC_NEW, REC_V1)
    assert "retrieved" not in resolved
    assert _without_millis_types(resolved) == RECOMMENDATION


def test_an_old_recommendation_is_read_by_new_consumers() -> None:
    old_bytes = _write(REC_V1, RECOMMENDATION)
    resolved = _read(old_bytes, REC_V1, REC_NEW)  # confluent framing: the default fills in
    assert resolved["retrieved"] is False
    assert _without_millis_types(resolved) == {**RECOMMENDATION, "retrieved": False}
    # raw framing: a record written before the upgrade lacks the last byte; a reader that
    # takes the new file as the writer schema runs out of bytes and must decode it with v1
    # as the writer (retrieved = false) instead.
    with pytest.raises(EOFError):
        fastavro.schemaless_reader(io.BytesIO(old_bytes), REC_NEW, None)


def test_retrieved_is_appended_last_with_a_default() -> None:
    new = json.loads(REC_NEW_PATH.read_text())
    old = json.loads((V1 / "recommendation.avsc").read_text())
    assert [f["name"] for f in new["fields"]] == [f["name"] for f in old["fields"]] + ["retrieved"]
    assert new["fields"][-1]["type"] == "boolean" and new["fields"][-1]["default"] is False
    assert _write(REC_NEW, RECOMMENDATION)[-1:] == b"\x00"  # a writer that omits it: false


def test_the_shipped_previous_schema_is_v1() -> None:
    shipped = fastavro.parse_schema(
        json.loads((REPO / "schemas/v1/recommendation.avsc").read_text())
    )
    assert to_parsing_canonical_form(shipped) == to_parsing_canonical_form(REC_V1)


@pytest.mark.parametrize("written", ["v1", "new"])
def test_the_output_reader_decodes_records_of_both_schemas_in_raw_framing(written: str) -> None:
    from pipeline.settings.loading import Settings
    from pipeline.tools.recommendation_reader import recommendation_codec

    codec = recommendation_codec(Settings())
    if written == "v1":
        data, want = _write(REC_V1, RECOMMENDATION), {**RECOMMENDATION, "retrieved": False}
    else:
        want = {**RECOMMENDATION, "retrieved": True}
        data = _write(REC_NEW, want)
    assert _without_millis_types(codec.decode(data)) == want
