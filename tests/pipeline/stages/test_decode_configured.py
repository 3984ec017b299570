"""The configured decoder: any schema's roles and feature fields as columns, the built-in rules
as reject reasons, Confluent framing through the registry (writer schemas resolved)."""

from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pytest

from model.features.mapping import EventField, EventRoles, FeatureMap, FieldKind, SchemaField, Store
from model.features.spec import string_to_id
from pipeline.connectors.avro import framing as wire
from pipeline.connectors.avro.schema_fields import named_types, schema_field, schema_node
from pipeline.connectors.avro.schema_registry import SchemaLookup
from pipeline.models.mapping import resolve_feature_map
from pipeline.settings.codec import CodecSettings
from pipeline.settings.loading import load_settings
from pipeline.settings.output import OutputSettings
from pipeline.stages.decode import ConfiguredDecoder
from pipeline.types import FieldColumns, RejectedMessage
from tests.conftest import REPO_ROOT
from tests.integration.byom import load_example

DEEPFM = load_example("deepfm")
DCN = load_example("dcn")


ECHOES = {
    "deepfm": {"browser": "viewer.browser", "at": "viewed_at", "slots": "slots",
               "recent": "recent_offer_ids", "viewer": "viewer.id", "hour": "hour_of_day"},
    "dcn": {"country": "session.country", "device": "session.device", "price": "price_ceiling",
            "terms": "query_terms", "want": "want", "listings": "listing_ids"},
}  # fmt: skip
"""Event fields carried into an output schema (``[output].echo``): every kind of field."""


def _map(name: str, echo: bool = False) -> FeatureMap:
    settings = load_settings(REPO_ROOT / "examples" / name / "streamrank.toml")
    events = settings.events.model_copy(
        update={"schema_file": REPO_ROOT / str(settings.events.schema_file)}
    )
    update: dict[str, Any] = {"events": events}
    if echo:  # only the echoes matter to the decode
        update["output"] = OutputSettings(
            schema_file=Path("out.avsc"), items="i", echo=ECHOES[name]
        )
    return resolve_feature_map(settings.model_copy(update=update))


@pytest.fixture(scope="module")
def deepfm_map() -> FeatureMap:
    return _map("deepfm")


def _view(**changes: Any) -> dict[str, Any]:
    record = DEEPFM.events(1, seed_=3)[0]
    record.update(
        view_id="v-1",
        viewer={"id": 41, "browser": "firefox"},
        offer_ids=[5, 6, 7],
        recent_offer_ids=[1, 2, 3, 4, 5, 6, 7],
        hour_of_day=13,
        slots=None,
    )
    record.update(changes)
    return record


def test_roles_and_fields_become_columns(deepfm_map: FeatureMap) -> None:
    decoder = ConfiguredDecoder(CodecSettings(), deepfm_map)
    values = [DEEPFM.encode(_view()), DEEPFM.encode(_view(view_id="v-2", slots=2, offer_ids=[9]))]
    events, accepted, rejections = decoder.decode_values(values)
    assert not rejections and accepted.tolist() == [0, 1]
    assert events.event_ids() == ["v-1", "v-2"]
    assert events.user_ids.tolist() == [41, 41]
    assert events.num_results.tolist() == [5, 2]  # null slots: num_results_default
    assert events.candidate_counts.tolist() == [3, 1]
    assert events.candidate_ids.tolist() == [5, 6, 7, 9]
    fields = events.fields
    assert fields is not None
    assert fields.ints.tolist() == [[41, string_to_id("firefox")]] * 2
    assert fields.floats.tolist() == [[13.0], [13.0]]
    assert fields.list_counts.tolist() == [[5], [5]]  # max_ids = 5: the first five kept
    assert fields.list_ids.tolist() == [1, 2, 3, 4, 5] * 2
    # slicing, taking and joining events keep the fields in step
    taken = events.take(np.array([1, 0]))
    assert taken.fields is not None and taken.fields.list_ids.tolist() == [1, 2, 3, 4, 5] * 2
    assert events.slice(1).fields.ints.shape == (1, 2)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("value", "reason", "detail"),
    [
        (b"", "empty_value", "empty"),
        (b"\x00" * (64 * 1024 + 1), "oversized_message", "65537 bytes"),
        (b"\xff\xff\xff", "undecodable", ""),
        (DEEPFM.encode(_view(offer_ids=[])), "no_candidates", "offer_ids is empty"),
        (DEEPFM.encode(_view(viewer={"id": -1, "browser": "x"})), "id_out_of_range", "viewer.id"),
        (DEEPFM.encode(_view(offer_ids=[-5])), "id_out_of_range", "item id -5"),
        (DEEPFM.encode(_view(slots=0)), "invalid_field", "num_results 0"),
        (DEEPFM.encode(_view(view_id="")), "invalid_string", "view_id has 0 characters"),
        (DEEPFM.encode(_view(viewed_at=5)), "invalid_event_time", "before 1973"),
        (
            DEEPFM.encode(_view(viewer={"id": 1, "browser": "b" * 300})),
            "invalid_string",
            "viewer.browser has 300 characters",
        ),
    ],
    # Named by reason and detail: the encoded values hold the time of collection, and pytest-xdist
    # workers must collect the same test ids.
    ids=lambda case: case if isinstance(case, str) else "value",
)
def test_the_built_in_rules_reject_with_their_reasons(
    deepfm_map: FeatureMap, value: bytes, reason: str, detail: str
) -> None:
    decoder = ConfiguredDecoder(CodecSettings(), deepfm_map)
    events, accepted, rejections = decoder.decode_values([DEEPFM.encode(_view()), value])
    assert accepted.tolist() == [0] and events.num_events == 1
    ((index, rejection),) = rejections
    assert index == 1 and rejection.reason.value == reason and detail in rejection.detail


def test_identity_ids_outside_the_table_are_dead_lettered_when_so_configured() -> None:
    fmap = _map("dcn")
    decoder = ConfiguredDecoder(CodecSettings(), fmap)
    good = DCN.events(1, seed_=1)[0]
    bad = copy.deepcopy(good)
    bad["listing_ids"] = [1, 3000]
    _, accepted, rejections = decoder.decode_values([DCN.encode(good), DCN.encode(bad)])
    assert accepted.tolist() == [0]
    ((_, rejection),) = rejections
    assert rejection.reason.value == "id_out_of_range"
    assert "features.sparse.listing: id 3000 not in [0, 3000)" in rejection.detail


def test_an_enum_and_string_lists_are_hashed_and_null_numbers_are_nan() -> None:
    fmap = _map("dcn")
    record = DCN.events(1, seed_=2)[0]
    record.update(query_terms=["oak", "desk"], price_ceiling=None)
    record["session"]["device"] = "WEB"
    events, _, _ = ConfiguredDecoder(CodecSettings(), fmap).decode_values([DCN.encode(record)])
    fields = events.fields
    assert fields is not None
    names = [f.field.name for f in fmap.event_fields]
    assert fields.ints[0, names.index("session.device")] == string_to_id("WEB")
    assert fields.list_ids.tolist()[-2:] == [string_to_id("oak"), string_to_id("desk")]
    assert np.isnan(fields.floats[0, 0])


def test_confluent_framing_resolves_the_writer_schema_through_the_registry(
    deepfm_map: FeatureMap, confluent_settings: CodecSettings, tmp_path: Path
) -> None:
    lookup = SchemaLookup(str(confluent_settings.schema_registry_url))
    same_id = lookup.register("page-views-value", REPO_ROOT / deepfm_map.schema_name)
    # A newer writer schema: one more field (with a default), which the reader skips.
    newer = json.loads((REPO_ROOT / deepfm_map.schema_name).read_text())
    newer["fields"].append({"name": "referrer", "type": "string", "default": ""})
    newer_path = tmp_path / "page_view_v2.avsc"
    newer_path.write_text(json.dumps(newer))
    newer_id = lookup.register("page-views-v2-value", newer_path)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(newer), {**_view(), "referrer": "ad"})
    values = [
        wire.header(same_id) + DEEPFM.encode(_view()),
        wire.header(newer_id) + body.getvalue(),
        DEEPFM.encode(_view()),  # not framed
        wire.header(9999) + DEEPFM.encode(_view()),
    ]
    decoder = ConfiguredDecoder(confluent_settings, deepfm_map)
    events, accepted, rejections = decoder.decode_values(values)
    assert accepted.tolist() == [0, 1] and events.user_ids.tolist() == [41, 41]
    assert [(i, r.reason.value) for i, r in rejections] == [
        (2, "bad_framing"),
        (3, "unknown_schema"),
    ]


def _no_address(detail: str) -> str:
    """fastavro's messages name a buffer object by its address."""
    return re.sub(r"0x[0-9a-f]+", "0x?", detail)


def _mutations(ex: Any, seed: int) -> list[bytes]:
    """Valid events and events that break each rule, of one example's schema."""
    rng = np.random.default_rng(seed)
    values = []
    for record in ex.events(120, seed_=seed):
        pick = int(rng.integers(0, 12))
        if ex is DEEPFM:
            if pick == 1:
                record["viewer"]["id"] = -int(rng.integers(1, 9))
            elif pick == 2:
                record["offer_ids"] = []
            elif pick == 3:
                record["viewer"]["browser"] = "" if rng.random() < 0.5 else "é" * 257
            elif pick == 4:
                record["slots"] = int(rng.integers(-2, 1))
        else:
            if pick == 1:
                record["listing_ids"].append(3000 + int(rng.integers(0, 5)))
            elif pick == 2:
                record["query_terms"] = ["", "oak"] if rng.random() < 0.5 else ["x" * 300]
            elif pick == 3:
                record["want"] = 0
            elif pick == 4:
                record["session"]["country"] = "ünïcödé"
        value = ex.encode(record)
        if pick == 5:
            value = value[: int(rng.integers(1, len(value)))]
        elif pick == 6:
            value = value + b"\x00"
        values.append(value)
    return values


def _raw_values(fmap: FeatureMap, fields: FieldColumns, event: int) -> dict[str, Any]:
    """One event's raw (echoed) fields, decoded with their schema types."""
    flat = fields.raw_counts.reshape(-1)  # event-major: an event's columns one after another
    starts = (np.cumsum(flat) - flat).reshape(fields.raw_counts.shape)
    out = {}
    for f in fmap.event_fields:
        if f.store is not Store.RAW:
            continue
        if not fields.raw_present[event, f.column]:
            out[f.field.name] = None
            continue
        node, _ = schema_node(fmap.schema, f.field.name)
        wrapper = {"type": "record", "name": "W", "fields": [{"name": "v", "type": node}]}
        schema = fastavro.parse_schema(wrapper, named_schemas=dict(named_types(fmap.schema)))
        at, n = starts[event, f.column], fields.raw_counts[event, f.column]
        buf = io.BytesIO(fields.raw_bytes[at : at + n].tobytes())
        out[f.field.name] = fastavro.schemaless_reader(buf, schema, None)["v"]  # type: ignore[index,call-overload]
        assert buf.tell() == n
    return out


@pytest.mark.parametrize("name", ["deepfm", "dcn"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_compiled_walk_decodes_as_the_record_path(name: str, seed: int) -> None:
    fmap = _map(name, echo=True)
    decoder = ConfiguredDecoder(CodecSettings(), fmap)
    assert decoder._program is not None  # these schemas take the compiled walk
    values = _mutations(DEEPFM if name == "deepfm" else DCN, seed)
    events, accepted, rejections = decoder.decode_values(values)
    records = decoder.records
    rows, want_accepted, want_rejections = [], [], []
    for i, value in enumerate(values):
        try:
            rows.append(records.event(value))
            want_accepted.append(i)
        except RejectedMessage as rejection:
            want_rejections.append((i, rejection.reason, _no_address(rejection.detail)))
    want = records.columns(rows)
    assert accepted.tolist() == want_accepted
    assert [(i, r.reason, _no_address(r.detail)) for i, r in rejections] == want_rejections
    assert 0 < len(want_rejections) < len(values)
    for column in ("event_id_bytes", "event_id_offsets", "user_ids", "event_time_ms",
                   "num_results", "candidate_counts", "candidate_ids"):  # fmt: skip
        np.testing.assert_array_equal(getattr(events, column), getattr(want, column), column)
    assert events.fields is not None and want.fields is not None
    np.testing.assert_array_equal(events.fields.ints, want.fields.ints)
    np.testing.assert_array_equal(events.fields.floats, want.fields.floats)
    np.testing.assert_array_equal(events.fields.list_counts, want.fields.list_counts)
    np.testing.assert_array_equal(events.fields.list_ids, want.fields.list_ids)
    np.testing.assert_array_equal(events.fields.int_present, want.fields.int_present)
    np.testing.assert_array_equal(events.fields.list_present, want.fields.list_present)
    # echoed fields: the bytes as written, equal on both paths, and the input's values
    assert events.fields.raw_counts.shape[1] == len(ECHOES[name])
    for array in ("raw_counts", "raw_present", "raw_bytes"):
        np.testing.assert_array_equal(getattr(events.fields, array), getattr(want.fields, array))
    ex = DEEPFM if name == "deepfm" else DCN
    schema = ex.SCHEMA
    for event, index in enumerate(accepted.tolist()):
        record = fastavro.schemaless_reader(io.BytesIO(values[index]), schema, None)
        got = _raw_values(fmap, events.fields, event)
        for dotted, value in got.items():
            assert value == SchemaField(tuple(dotted.split(".")), FieldKind.INT, True, "").read(
                record  # type: ignore[arg-type]
            ), dotted


def test_a_null_field_is_absent_and_an_empty_list_is_present_on_both_paths(
    tmp_path: Path,
) -> None:
    """Nullable ids, id lists, string lists and a nullable record's string: the compiled walk
    and the record path mark the same values absent (null) and present ([] included)."""
    schema = json.loads((REPO_ROOT / "examples" / "deepfm" / "page_view.avsc").read_text())
    schema["fields"] += [
        {"name": "coupon", "type": ["null", "long"], "default": None},
        {"name": "tags", "type": ["null", {"type": "array", "items": "long"}], "default": None},
        {"name": "words", "type": ["null", {"type": "array", "items": "string"}]},
        {
            "name": "ref",
            "type": ["null", {"type": "record", "name": "Ref", "fields": [
                {"name": "site", "type": "string"}]}],
        },
    ]  # fmt: skip
    (tmp_path / "view.avsc").write_text(json.dumps(schema))
    parsed = fastavro.parse_schema(schema)
    roles = EventRoles(
        *(schema_field(parsed, p) for p in ("view_id", "viewer.id", "offer_ids", "viewed_at")),
        num_results=None,
        num_results_default=3,
    )
    fields = tuple(
        EventField(schema_field(parsed, name), Store.LISTS, column, cap)
        for column, (name, cap) in enumerate(
            [("coupon", 1), ("tags", 3), ("words", 2), ("ref.site", 1)]
        )
    )
    fmap = FeatureMap(parsed, str(tmp_path / "view.avsc"), roles, fields, None, None, (), ())
    cases = [
        {"coupon": None, "tags": None, "words": None, "ref": None},
        {"coupon": 5, "tags": [], "words": [], "ref": {"site": "x"}},
        {"coupon": -1, "tags": [1, 2, 3, 4], "words": ["a", "b", "c"], "ref": None},
    ]
    values = []
    for case in cases:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, {**_view(), **case})
        values.append(buf.getvalue())
    decoder = ConfiguredDecoder(CodecSettings(), fmap)
    assert decoder._program is not None
    walked, accepted, _ = decoder.decode_values(values)
    recorded = decoder.records.columns([decoder.records.event(v) for v in values])
    assert accepted.tolist() == [0, 1, 2]
    for got in (walked.fields, recorded.fields):
        assert got is not None
        assert got.list_present.tolist() == [
            [False, False, False, False],
            [True, True, True, True],
            [True, True, True, False],
        ]
        assert got.list_counts.tolist() == [[0, 0, 0, 0], [1, 0, 0, 1], [1, 3, 2, 0]]
        assert got.list_ids.tolist() == [
            5, string_to_id("x"), -1, 1, 2, 3, string_to_id("a"), string_to_id("b"),
        ]  # fmt: skip


WEIGHTED = load_example("weighted")


def _weighted_map(schema_file: Path | None = None) -> FeatureMap:
    settings = load_settings(REPO_ROOT / "examples" / "weighted" / "streamrank.toml")
    path = schema_file or REPO_ROOT / str(settings.events.schema_file)
    events = settings.events.model_copy(update={"schema_file": path})
    return resolve_feature_map(settings.model_copy(update={"events": events}))


@pytest.mark.parametrize("item", ["float", "double"])
def test_weights_decode_beside_their_ids_on_both_paths(tmp_path: Path, item: str) -> None:
    """A float (or double) array of one weight per id: kept with the ids (the first max_ids),
    as float32; another length, or a weight that is not a finite float32, dead-letters the
    event naming the key; the compiled walk and the record path agree."""
    schema = json.loads((REPO_ROOT / "examples" / "weighted" / "feed_request.avsc").read_text())
    for field in schema["fields"]:
        if field["name"] == "topic_minutes":
            field["type"]["items"] = item
    (tmp_path / "feed.avsc").write_text(json.dumps(schema))
    fmap = _weighted_map(tmp_path / "feed.avsc")
    decoder = ConfiguredDecoder(CodecSettings(), fmap)
    assert decoder._program is not None
    writer = fastavro.parse_schema(schema)
    records = WEIGHTED.events(30, seed_=4)
    records[1].update(topics=[1, 2, 3], topic_minutes=[0.5])
    records[2].update(topics=[1], topic_minutes=[float("nan")])
    records[3].update(topics=[], topic_minutes=[])
    records[4].update(topics=list(range(9)), topic_minutes=[i + 0.25 for i in range(9)])
    records[5].update(topics=[7], topic_minutes=[1e39 if item == "double" else float("inf")])
    values = []
    for record in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, writer, record)
        values.append(buf.getvalue())
    events, accepted, rejections = decoder.decode_values(values)
    assert [(i, r.reason.value, r.detail) for i, r in rejections] == [
        (
            1,
            "invalid_field",
            "features.sparse.topics: 1 weights (topic_minutes) for 3 ids (topics): one weight "
            "per id",
        ),
        (
            2,
            "invalid_field",
            "features.sparse.topics: weight nan in topic_minutes is not a finite float32",
        ),
        (
            5,
            "invalid_field",
            f"features.sparse.topics: weight {1e39 if item == 'double' else float('inf')} in "
            "topic_minutes is not a finite float32",
        ),
    ]
    kept = [records[i] for i in accepted.tolist()]
    want = np.concatenate([np.float32(r["topic_minutes"][:6]) for r in kept])
    assert events.fields is not None and events.fields.list_weights is not None
    np.testing.assert_array_equal(events.fields.list_weights, want)
    np.testing.assert_array_equal(
        events.fields.list_ids, np.concatenate([np.int64(r["topics"][:6]) for r in kept])
    )
    recorded = decoder.records.columns([decoder.records.event(values[i]) for i in accepted])
    assert recorded.fields is not None
    np.testing.assert_array_equal(recorded.fields.list_weights, want)
    np.testing.assert_array_equal(recorded.fields.list_ids, events.fields.list_ids)
    taken = events.take(np.array([2, 0]))
    assert taken.fields is not None and taken.fields.list_weights is not None
    first = int(events.fields.list_counts[0, 0])
    np.testing.assert_array_equal(taken.fields.list_weights[-first:], want[:first])
