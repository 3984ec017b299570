"""The compiled writer of an output schema of the user's, against fastavro: random batches through
many shapes (an array of records, parallel arrays, nullable unions, defaults, nested and
nullable records on a role's path, floats and doubles, event ids as strings or longs, input
fields echoed as written: strings, enums, ints into longs, nullable doubles, string lists), read
back with ``fastavro.schemaless_reader`` and the schema alone."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.connectors.avro import framing as wire
from pipeline.connectors.avro.output_roles import Binding, EchoSource, Role
from pipeline.connectors.avro.reference import records_to_columns
from pipeline.connectors.avro.rules import epoch_millis
from pipeline.connectors.avro.schema_fields import named_types, schema_node
from pipeline.connectors.avro.write_program import compile_writer
from pipeline.stages.publish.configured import SchemaEncoder
from pipeline.stages.publish.flags import FallbackFlags
from pipeline.types import EventColumns, FieldColumns, ScoredBatch

INPUT = fastavro.parse_schema({
    "type": "record", "name": "In", "namespace": "t.input", "fields": [
        {"name": "country", "type": "string"},
        {"name": "device", "type": {"type": "enum", "name": "Device",
                                    "symbols": ["IOS", "ANDROID", "WEB"]}},
        {"name": "count", "type": "int"},
        {"name": "price", "type": ["null", "double"]},
        {"name": "ratio", "type": "float"},
        {"name": "flag", "type": "boolean"},
        {"name": "terms", "type": {"type": "array", "items": "string"}},
        {"name": "ctx", "type": {"type": "record", "name": "Ctx", "fields": [
            {"name": "page", "type": "long"}]}},
    ]})  # fmt: skip
"""The event schema whose fields are echoed."""

RANKED = fastavro.parse_schema({
    "type": "record", "name": "Ranking", "namespace": "t.out", "fields": [
        {"name": "request", "type": "string"},
        {"name": "shopper", "type": ["null", "long"], "default": None},
        {"name": "ranked", "type": {"type": "array", "items": {
            "type": "record", "name": "Ranked", "fields": [
                {"name": "listing", "type": "long"},
                {"name": "score", "type": "double"},
                {"name": "p_click", "type": "float"},
                {"name": "p_buy", "type": ["null", "double"]},
                {"name": "source", "type": "string", "default": "ranker"},
            ]}}},
        {"name": "meta", "type": ["null", {"type": "record", "name": "Meta", "fields": [
            {"name": "version", "type": "string"},
            {"name": "scored_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "region", "type": "string", "default": "eu"},
        ]}]},
        {"name": "requested_at", "type": "long"},
        {"name": "degraded", "type": {"type": "array", "items": "string"}},
        {"name": "country", "type": "string"},
        {"name": "device", "type": ["null", {"type": "enum", "name": "Device",
                                             "symbols": ["IOS", "ANDROID", "WEB"]}]},
        {"name": "count", "type": "long"},
        {"name": "price", "type": ["null", "double"], "default": None},
        {"name": "ratio", "type": "float"},
        {"name": "flag", "type": "boolean"},
        {"name": "terms", "type": {"type": "array", "items": "string"}},
        {"name": "page", "type": "long"},
        {"name": "extra", "type": {"type": "record", "name": "Extra", "fields": [
            {"name": "note", "type": ["null", "string"], "default": None},
            {"name": "tags", "type": {"type": "array", "items": "string"}, "default": ["a"]},
        ]}},
    ]})  # fmt: skip
"""An array of records: each item's id, ranking score and two task scores (a float, a
nullable double), a default per item; the model version inside a nullable record."""

PARALLEL = fastavro.parse_schema({
    "type": "record", "name": "Parallel", "fields": [
        {"name": "id", "type": "long"},
        {"name": "item_ids", "type": {"type": "array", "items": "long"}},
        {"name": "scores", "type": ["null", {"type": "array", "items": "float"}]},
        {"name": "click", "type": {"type": "array", "items": "double"}},
        {"name": "any_fallback", "type": "boolean"},
        {"name": "retrieved", "type": "boolean"},
        {"name": "user", "type": "long"},
        {"name": "version", "type": ["null", "string"], "default": None},
    ]})  # fmt: skip
"""Parallel arrays (ids, scores, one task score), the event id as a long."""

ECHOED = ("country", "device", "count", "price", "ratio", "flag", "terms", "ctx.page")


def _echo(column: int, dotted: str) -> EchoSource:
    node, nullable = schema_node(INPUT, dotted)
    return EchoSource(column, dotted, node, named_types(INPUT), nullable)


def _ranked_bindings() -> list[Binding]:
    out = [
        Binding("output.event_id", ("request",), Role.EVENT_ID),
        Binding("output.user_id", ("shopper",), Role.USER_ID),
        Binding("output.items", ("ranked", "listing"), Role.ITEMS),
        Binding("output.scores", ("ranked", "score"), Role.SCORES),
        Binding("output.task_scores.click", ("ranked", "p_click"), Role.TASK_SCORE, 1),
        Binding("output.task_scores.buy", ("ranked", "p_buy"), Role.TASK_SCORE, 0),
        Binding("output.model_version", ("meta", "version"), Role.MODEL_VERSION),
        Binding("output.scored_at", ("meta", "scored_at"), Role.SCORED_AT),
        Binding("output.event_time", ("requested_at",), Role.EVENT_TIME),
        Binding("output.fallback_features", ("degraded",), Role.FALLBACK_FEATURES),
    ]
    out += [
        Binding(f"output.echo.{name}", (name.rpartition(".")[2],), Role.ECHO, echo=_echo(i, name))
        for i, name in enumerate(ECHOED)
    ]
    return out


def _parallel_bindings() -> list[Binding]:
    return [
        Binding("output.event_id", ("id",), Role.EVENT_ID),
        Binding("output.items", ("item_ids",), Role.ITEMS),
        Binding("output.scores", ("scores",), Role.SCORES),
        Binding("output.task_scores.click", ("click",), Role.TASK_SCORE, 1),
        Binding("output.fallback_features", ("any_fallback",), Role.FALLBACK_FEATURES),
        Binding("output.retrieved", ("retrieved",), Role.RETRIEVED),
        Binding("output.user_id", ("user",), Role.USER_ID),
    ]


def _raw(records: list[dict[str, Any]]) -> FieldColumns:
    """The echoed input fields as the decode carries them: their Avro bytes as written."""
    writers = []
    for name in ECHOED:
        node, _ = schema_node(INPUT, name)
        wrapper = {"type": "record", "name": "W", "fields": [{"name": "v", "type": node}]}
        writers.append(fastavro.parse_schema(wrapper, named_schemas=dict(named_types(INPUT))))
    fields = FieldColumns.empty(len(records), raw=len(ECHOED))
    data = bytearray()
    for e, record in enumerate(records):
        for c, name in enumerate(ECHOED):
            value = record[name]
            if value is None:
                continue
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, writers[c], {"v": value})
            fields.raw_counts[e, c] = len(buf.getvalue())
            fields.raw_present[e, c] = 1
            data += buf.getvalue()
    fields.raw_bytes = np.frombuffer(bytes(data), dtype=np.uint8).copy()
    return fields


def _events(ids: list[str], users: list[int], times: list[int]) -> EventColumns:
    return records_to_columns([
        {"event_id": i, "user_id": u, "event_time": t, "context": {"device": "", "country": ""},
         "candidate_item_ids": [0], "recent_item_ids": [], "num_results": 1}
        for i, u, t in zip(ids, users, times, strict=True)
    ])  # fmt: skip


longs = st.integers(-(2**63), 2**63 - 1)
f32 = st.floats(width=32, allow_nan=False)
doubles = st.floats(-3e38, 3e38)  # written as floats too: within their range
inputs = st.fixed_dictionaries({
    "country": st.text(max_size=8),
    "device": st.sampled_from(["IOS", "ANDROID", "WEB"]),
    "count": st.integers(-(2**31), 2**31 - 1),
    "price": st.none() | st.floats(allow_nan=False),
    "ratio": f32,
    "flag": st.booleans(),
    "terms": st.lists(st.text(max_size=5), max_size=4),
    "ctx.page": longs,
})  # fmt: skip
event = st.tuples(
    st.text(min_size=1, max_size=10),  # event id
    longs,  # user id
    st.integers(0, 2**50),  # event time
    st.lists(st.tuples(longs, doubles, f32, f32), max_size=5),  # kept items
    st.booleans(),  # user features fell back
    st.booleans(),  # item features fell back
    inputs,
)


def _scored(batch: list[Any], version: str) -> ScoredBatch:
    return ScoredBatch(
        counts=np.array([len(e[3]) for e in batch], dtype=np.int64),
        item_ids=np.array([i for e in batch for i, *_ in e[3]], dtype=np.int64),
        scores=np.array([s for e in batch for _, s, _, _ in e[3]], dtype=np.float64),
        model_version=version,
        task_scores=np.array(
            [[b, c] for e in batch for *_, c, b in e[3]], dtype=np.float32
        ).reshape(-1, 2),
    )


def _flags(batch: list[Any]) -> FallbackFlags:
    return FallbackFlags(
        user=np.array([e[4] for e in batch], dtype=bool),
        item=np.array([e[5] for e in batch], dtype=bool),
    )


def _read(schema: Any, value: bytes, header: bytes = b"") -> dict[str, Any]:
    assert value.startswith(header)
    buf = io.BytesIO(value)
    buf.seek(len(header))
    record = fastavro.schemaless_reader(buf, schema, None)
    assert buf.tell() == len(value), "bytes left over"
    assert isinstance(record, dict)
    return record


def _f32(x: float) -> float:
    return float(np.float32(x))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(event, max_size=6), version=st.text(max_size=12), now=st.integers(0, 2**41))
def test_an_array_of_records_with_echoed_fields_reads_back_with_the_schema_alone(
    batch: list[Any], version: str, now: int
) -> None:
    program = compile_writer(RANKED, _ranked_bindings())
    events = _events([e[0] for e in batch], [e[1] for e in batch], [e[2] for e in batch])
    events.fields = _raw([e[6] for e in batch])
    header = wire.header(7)
    values = SchemaEncoder(header, program).encode(
        events, _scored(batch, version), _flags(batch), now
    )
    assert len(values) == len(batch)
    for value, (eid, uid, time, items, user_fb, item_fb, inp) in zip(values, batch, strict=True):
        got = _read(RANKED, value, header)
        assert epoch_millis(got["meta"].pop("scored_at")) == now
        assert got == {
            "request": eid,
            "shopper": uid,
            "ranked": [
                {"listing": i, "score": s, "p_click": _f32(c), "p_buy": _f32(b), "source": "ranker"}
                for i, s, c, b in items
            ],
            "meta": {"version": version, "region": "eu"},
            "requested_at": time,
            "degraded": [n for n, on in (("user_features", user_fb), ("item_features", item_fb))
                         if on],
            "country": inp["country"],
            "device": inp["device"],
            "count": inp["count"],
            "price": inp["price"],
            "ratio": _f32(inp["ratio"]),
            "flag": inp["flag"],
            "terms": inp["terms"],
            "page": inp["ctx.page"],
            "extra": {"note": None, "tags": ["a"]},
        }  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(event, max_size=6), ids=st.lists(longs, min_size=6, max_size=6))
def test_parallel_arrays_and_a_long_event_id_read_back(batch: list[Any], ids: list[int]) -> None:
    program = compile_writer(PARALLEL, _parallel_bindings(), event_id_long=True)
    events = _events([str(i) for i in ids[: len(batch)]], [e[1] for e in batch], [0] * len(batch))
    events.retrieved = np.array([e[4] != e[5] for e in batch], dtype=bool)
    values = SchemaEncoder(b"", program).encode(events, _scored(batch, "v"), _flags(batch), 0)
    for e, (value, (_, uid, _, items, user_fb, item_fb, _)) in enumerate(
        zip(values, batch, strict=True)
    ):
        assert _read(PARALLEL, value) == {
            "id": ids[e],
            "item_ids": [i for i, *_ in items],
            "scores": [_f32(s) for _, s, _, _ in items],
            "click": [_f32(c) for _, _, c, _ in items],
            "any_fallback": user_fb or item_fb,
            "retrieved": user_fb != item_fb,
            "user": uid,
            "version": None,
        }


def test_a_null_echo_writes_the_null_branch_and_a_non_null_one_the_value_branch() -> None:
    schema = fastavro.parse_schema({"type": "record", "name": "O", "fields": [
        {"name": "items", "type": {"type": "array", "items": "long"}},
        {"name": "price", "type": ["double", "null"]},
        {"name": "count", "type": ["null", "string", "long"]},
    ]})  # fmt: skip
    bindings = [
        Binding("output.items", ("items",), Role.ITEMS),
        Binding("output.echo.price", ("price",), Role.ECHO, echo=_echo(3, "price")),
        Binding("output.echo.count", ("count",), Role.ECHO, echo=_echo(2, "count")),
    ]
    program = compile_writer(schema, bindings)
    records = [
        {n: None for n in ECHOED} | {"price": None, "count": 7, "ctx.page": 0},
        {n: None for n in ECHOED} | {"price": 2.5, "count": -3, "ctx.page": 0},
    ]
    events = _events(["a", "b"], [1, 2], [0, 0])
    events.fields = _raw(records)
    no = np.zeros(2, dtype=bool)
    scored = ScoredBatch(np.array([1, 0]), np.array([42]), np.array([0.5]), "v")
    values = SchemaEncoder(b"", program).encode(events, scored, FallbackFlags(no, no), 0)
    assert [_read(schema, v) for v in values] == [
        {"items": [42], "price": None, "count": 7},
        {"items": [], "price": 2.5, "count": -3},
    ]


@pytest.mark.parametrize("items", [0, 1, 3])
def test_the_buffer_holds_the_largest_records(items: int) -> None:
    """Long event ids, versions, echoed strings: the capacity bounds what is written."""
    program = compile_writer(RANKED, _ranked_bindings())
    batch = [
        ("é" * 300, -(2**63), 2**62, [(2**63 - 1, 1.0, 1.0, 1.0)] * items, True, True,
         {"country": "ü" * 400, "device": "WEB", "count": -(2**31), "price": -1.5,
          "ratio": 3.0, "flag": True, "terms": ["x" * 50] * 20, "ctx.page": -(2**63)}),
    ] * 3  # fmt: skip
    events = _events([e[0] for e in batch], [e[1] for e in batch], [e[2] for e in batch])
    events.fields = _raw([e[6] for e in batch])
    encoder = SchemaEncoder(b"", program)
    values = encoder.encode(events, _scored(batch, "v" * 500), _flags(batch), 2**41)
    assert all(_read(RANKED, v)["country"] == "ü" * 400 for v in values)
