"""The decode stage against the fastavro reference: random valid events and damaged messages.

The compiled kernel and the reference apply the same rules (:mod:`pipeline.connectors.avro.rules`):
these
property tests hold them to the same verdict and the same columns on every message."""

from __future__ import annotations

import io
import time
from typing import Any

import fastavro
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.connectors.avro import kernels
from pipeline.connectors.avro.reference import (
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
    records_to_columns,
)
from pipeline.connectors.avro.rules import (
    EARLIEST_EVENT_MS,
    STATUS_OK,
    STATUS_REASONS,
    STATUS_SLOW_PATH,
)
from pipeline.connectors.avro.schema_registry import load_schema
from pipeline.settings.codec import CodecSettings
from pipeline.stages.decode import MessageDecoder
from pipeline.types import EventColumns, RejectedMessage, RejectReason
from tests.pipeline.factories import event_messages
from tests.pipeline.fakes import polled

LIMITS = CodecSettings(
    max_message_bytes=400,
    max_candidates=12,
    max_id=10**6,
    max_num_results=40,
    max_recent_items=5,
    max_string_length=10,
)
_NOW_MS = int(time.time() * 1000)
_valid_time = st.integers(EARLIEST_EVENT_MS, _NOW_MS)
RECENT_CAP = 3
SCHEMA = load_schema(USER_EVENT_SCHEMA_FILE)
_valid_id = st.integers(0, 10**6)
_any_long = st.integers(-(2**63), 2**63 - 1)
ids = st.one_of(*[_valid_id] * 30, _any_long)  # mostly valid, so most events are accepted

events = st.fixed_dictionaries(
    {
        "event_id": st.text(max_size=12),
        "user_id": ids,
        "event_time": st.one_of(
            *[_valid_time] * 6, st.integers(0, 2**41), st.integers(-(2**63), 2**63 - 1)
        ),
        "context": st.fixed_dictionaries(
            {"device": st.sampled_from(["ios", "web", "", "é"]), "country": st.text(max_size=3)}
        ),
        "candidate_item_ids": st.lists(ids, max_size=15),
        "recent_item_ids": st.one_of(st.none(), st.lists(ids, max_size=6)),
        "num_results": st.one_of(*[st.integers(1, 40)] * 9, st.integers(-(2**31), 2**31 - 1)),
    }
)


def _encode(event: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, SCHEMA, event)
    return buf.getvalue()


def damage(value: bytes, kind: int, at: int, byte: int) -> bytes:
    """1: truncated, 2: trailing byte, 3: one byte replaced, 4: empty; else intact."""
    at = at % max(1, len(value))
    if kind == 1:
        return value[:at]
    if kind == 2:
        return value + bytes([byte])
    if kind == 3:
        return value[:at] + bytes([byte]) + value[at + 1 :]
    if kind == 4:
        return b""
    return value


messages = st.lists(
    st.tuples(events, st.integers(0, 4), st.integers(0, 400), st.integers(0, 255)).map(
        lambda t: damage(_encode(t[0]), *t[1:])
    ),
    max_size=12,
)


def _reference(decoder: MessageDecoder, values: list[bytes]) -> list[dict[str, Any] | str]:
    out: list[dict[str, Any] | str] = []
    for value in values:
        try:
            out.append(decoder.reference.decode(value))
        except RejectedMessage as rejection:
            out.append(rejection.reason.value)
    return out


def assert_same_columns(got: EventColumns, want: EventColumns) -> None:
    assert got.event_ids() == want.event_ids()
    for name in ("user_ids", "event_time_ms", "device_ids", "country_ids", "num_results"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    for name in ("candidate_counts", "candidate_ids", "recent_counts", "recent_ids", "retrieved"):
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


@settings(max_examples=300, deadline=None)
@given(messages, st.booleans())
def test_kernel_agrees_with_fastavro_on_every_message(values: list[bytes], retrieve: bool) -> None:
    decoder = MessageDecoder(LIMITS, RECENT_CAP, retrieve=retrieve)
    reference = _reference(decoder, values)
    status, columns = decoder.kernel(list(values))
    kernel = ["ok" if s == STATUS_OK else STATUS_REASONS[s].value for s in status.tolist()]
    assert kernel == ["ok" if isinstance(r, dict) else r for r in reference]
    assert_same_columns(columns, records_to_columns([r for r in reference if isinstance(r, dict)]))


@settings(max_examples=100, deadline=None)
@given(messages, st.booleans())
def test_decode_gives_accepted_columns_and_reference_rejections(
    values: list[bytes], retrieve: bool
) -> None:
    decoder = MessageDecoder(LIMITS, RECENT_CAP, retrieve=retrieve)
    reference = _reference(decoder, values)
    batch = decoder.decode(polled(event_messages("in", list(values))))
    accepted = [i for i, r in enumerate(reference) if isinstance(r, dict)]
    assert batch.event_message.tolist() == accepted
    assert batch.offsets.tolist() == list(range(len(values)))
    assert [(i, r.reason.value) for i, r in batch.rejections] == [
        (i, r) for i, r in enumerate(reference) if isinstance(r, str)
    ]
    want = records_to_columns([reference[i] for i in accepted])  # type: ignore[misc]
    assert_same_columns(batch.events, want)


def test_valid_events_decode_to_the_reference_columns() -> None:
    rng = np.random.default_rng(7)
    values = []
    for i in range(300):
        values.append(
            _encode(
                {
                    "event_id": f"ev-{i}-ü",
                    "user_id": int(rng.integers(0, 10**6)),
                    "event_time": int(rng.integers(EARLIEST_EVENT_MS, _NOW_MS)),
                    "context": {"device": ["ios", "web"][i % 2], "country": "DE"},
                    "candidate_item_ids": rng.integers(0, 10**6, rng.integers(1, 13)).tolist(),
                    "recent_item_ids": [None, rng.integers(0, 10**6, i % 5).tolist()][i % 2],
                    "num_results": int(rng.integers(1, 41)),
                }
            )
        )
    decoder = MessageDecoder(LIMITS, RECENT_CAP)
    events, accepted, rejections = decoder.decode_values(list(values))
    assert rejections == []
    assert accepted.tolist() == list(range(300))
    assert_same_columns(events, records_to_columns([decoder.reference.decode(v) for v in values]))


def test_confluent_framing_same_schema_in_the_kernel_others_via_the_reference(
    confluent_settings: CodecSettings, make_event: Any
) -> None:
    codec = RecordCodec(confluent_settings, USER_EVENT_SCHEMA_FILE, "user-events")
    good = [codec.encode(make_event(user_id=u)) for u in (1, 2)]
    raw = _encode(make_event(user_id=3))  # no header: bad framing
    unknown = b"\x00\x00\x00\x03\xe7" + raw  # schema id 999 is not registered
    decoder = MessageDecoder(confluent_settings, RECENT_CAP)
    status, _ = decoder.kernel([good[0], raw, unknown, good[1]])
    assert status.tolist() == [STATUS_OK, STATUS_SLOW_PATH, STATUS_SLOW_PATH, STATUS_OK]
    events, _, rejections = decoder.decode_values([good[0], raw, unknown, good[1]])
    assert events.user_ids.tolist() == [1, 2]
    assert [(i, r.reason) for i, r in rejections] == [
        (1, RejectReason.BAD_FRAMING),
        (2, RejectReason.UNKNOWN_SCHEMA),
    ]


def test_an_event_without_candidates_is_valid_only_with_retrieval() -> None:
    event = {
        "event_id": "ev-empty",
        "user_id": 5,
        "event_time": _NOW_MS,
        "context": {"device": "ios", "country": "DE"},
        "candidate_item_ids": [],
        "recent_item_ids": [3, 4],
        "num_results": 3,
    }
    values = [_encode(event), _encode({**event, "candidate_item_ids": [1, 2]})]
    events, accepted, rejections = MessageDecoder(LIMITS, RECENT_CAP).decode_values(values)
    assert accepted.tolist() == [1]
    assert [(i, r.reason) for i, r in rejections] == [(0, RejectReason.NO_CANDIDATES)]
    events, accepted, rejections = MessageDecoder(LIMITS, RECENT_CAP, retrieve=True).decode_values(
        values
    )
    assert accepted.tolist() == [0, 1] and rejections == []
    assert events.candidate_counts.tolist() == [0, 2]
    assert events.recent_counts.tolist() == [2, 2]
    assert events.retrieved.tolist() == [False, False]  # retrieval comes after decoding


def test_an_oversized_value_is_refused_without_being_copied(monkeypatch: Any) -> None:
    """The kernel's buffer holds the other values only: 10 MB over the limit cost nothing."""
    event = {
        "event_id": "ev-1",
        "user_id": 5,
        "event_time": _NOW_MS,
        "context": {"device": "ios", "country": "DE"},
        "candidate_item_ids": [1, 2],
        "recent_item_ids": None,
        "num_results": 3,
    }
    good = _encode(event)
    just_over = good + b"\x00" * (LIMITS.max_message_bytes + 1 - len(good))
    huge = b"\x02" * 10_000_000
    decoder = MessageDecoder(LIMITS, RECENT_CAP)
    seen: list[int] = []
    kernel = kernels.decode_user_events

    def spy(buf: np.ndarray, *args: Any) -> Any:
        seen.append(len(buf))
        return kernel(buf, *args)

    monkeypatch.setattr(kernels, "decode_user_events", spy)
    events, accepted, rejections = decoder.decode_values([good, huge, just_over, good])
    assert seen == [2 * len(good)]
    assert accepted.tolist() == [0, 3] and events.user_ids.tolist() == [5, 5]
    assert [(i, r.reason) for i, r in rejections] == [
        (1, RejectReason.OVERSIZED),
        (2, RejectReason.OVERSIZED),
    ]
