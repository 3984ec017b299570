"""Resolving a feature map: what each mistake says (one line naming the key) and what the
examples resolve to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

from model.features.mapping import Missing, RecordKind, Store
from model.features.spec import string_to_id
from pipeline.models.mapping import FeatureMapError, resolve_feature_map
from pipeline.settings.features import SparseSettings
from pipeline.settings.loading import Settings, load_settings
from tests.conftest import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"


def _settings(name: str, **features: Any) -> Settings:
    settings = load_settings(EXAMPLES / name / "streamrank.toml")
    events = settings.events.model_copy(
        update={"schema_file": REPO_ROOT / str(settings.events.schema_file)}
    )
    data = settings.features.model_dump()
    for path, value in features.items():
        *parents, last = path.split("__")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    return settings.model_copy(
        update={"events": events, "features": type(settings.features)(**data)}
    )


def test_the_examples_resolve_to_their_keys_and_stores() -> None:
    fmap = resolve_feature_map(_settings("dcn"))
    assert fmap.layout.keys == (
        "shopper", "country", "device", "listing", "terms", "category", "recent",
    )  # fmt: skip
    assert fmap.layout.ids_per_key == (1, 1, 1, 1, 4, 1, 6)
    assert fmap.layout.dense_dim == 8
    stores = {f.field.name: f.store for f in fmap.event_fields}
    assert stores == {
        "session.shopper_id": Store.INTS,
        "session.country": Store.INTS,
        "session.device": Store.INTS,
        "query_terms": Store.LISTS,
        "price_ceiling": Store.FLOATS,
    }


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"sparse__country__transform": "identity"},
            "features.sparse.country: session.country is a string (hashed to 64 bits): use "
            "transform = 'modulo' or 'hash'",
        ),
        (
            {"sparse__category__transform": "identity", "sparse__category__out_of_range": "dlq"},
            "features.sparse.category: out_of_range = 'dlq' is for event and candidate ids",
        ),
        (
            {"sparse__recent__field": "profile"},
            "features.sparse.recent.field = 'profile' is a vector",
        ),
        (
            {"sparse__listing__default_row": 3000},
            "features.sparse.listing.default_row = 3000: the table has 3000 rows",
        ),
        (
            {"user__fields": {"recent": "id_list:6", "profile": "vector:3"}},
            "features.user.fields: the packed layout holds (vector) or (vector, id_list)",
        ),
        (
            {"item__fields": {"category": "id:2", "quality": "vector:4"}},
            "features.item.fields.category = 'id:2': expected 'vector:N', 'id', 'id_list:N' or "
            "'weights:<an id_list field>'",
        ),
        ({"dense": []}, "features.dense: declare at least one"),
        (
            {"sparse__category__missing": "row", "sparse__category__missing_row": 40},
            "features.sparse.category.missing_row = 40: the table has 40 rows",
        ),
        (
            {"sparse__listing__missing": "row", "sparse__listing__missing_row": 1},
            "features.sparse.listing.missing = 'row': a candidate id is never missing; drop "
            "missing",
        ),
        (
            {"sparse__shopper__missing": "id", "sparse__shopper__missing_id": 3},
            "features.sparse.shopper.missing = 'id': session.shopper_id is never missing (not "
            "nullable)",
        ),
        (
            {"sparse__recent__missing": "id", "sparse__recent__missing_id": 3000},
            "features.sparse.recent.missing_id = 3000: outside the table's 3000 rows "
            "(transform = 'identity'); use missing = 'row'",
        ),
        (
            {"sparse__category__missing": "id", "sparse__category__missing_id": "none"},
            "features.sparse.category.missing_id = 'none': a string is for a string field",
        ),
        (
            {"sparse__category__missing": "id", "sparse__category__missing_id": 2**63},
            "features.sparse.category.missing_id = 9223372036854775808: not a signed 64-bit id",
        ),
        (
            {"item__fields": {f"f{i}": "id" for i in range(64)}},
            "features.item.fields: 64 fields; a record holds at most 63",
        ),
    ],
)
def test_a_mistake_is_one_line_naming_the_key(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(FeatureMapError) as error:
        resolve_feature_map(_settings("dcn", **changes))
    assert says in str(error.value) and "\n" not in str(error.value)


def test_a_schema_that_does_not_parse_or_a_union_of_types_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.avsc"
    bad.write_text('{"type": "record", "name": "E", "fields": [{"name": "x"}]}')
    settings = _settings("deepfm")
    with pytest.raises(FeatureMapError, match="is not an Avro schema"):
        resolve_feature_map(
            settings.model_copy(
                update={"events": settings.events.model_copy(update={"schema_file": bad})}
            )
        )
    union = (
        (EXAMPLES / "deepfm" / "page_view.avsc")
        .read_text()
        .replace('"type": "int"}', '"type": ["int", "string"]}')
    )
    (tmp_path / "u.avsc").write_text(union)
    with pytest.raises(FeatureMapError, match=r"hour_of_day is a union of 2 types"):
        resolve_feature_map(
            settings.model_copy(
                update={
                    "events": settings.events.model_copy(
                        update={"schema_file": tmp_path / "u.avsc"}
                    )
                }
            )
        )


def test_each_missing_policy_resolves_onto_its_key(tmp_path: Path) -> None:
    schema = (EXAMPLES / "dcn" / "search_request.avsc").read_text()
    nullable = schema.replace('{"name": "country", "type": "string"}',
                              '{"name": "country", "type": ["null", "string"]}')  # fmt: skip
    assert nullable != schema
    (tmp_path / "s.avsc").write_text(nullable)
    settings = _settings(
        "dcn",
        sparse__category__missing="row",
        sparse__category__missing_row=39,
        sparse__recent__missing="id",
        sparse__recent__missing_id=2999,
        sparse__country__missing="id",
        sparse__country__missing_id="unknown",
    )
    settings = settings.model_copy(
        update={"events": settings.events.model_copy(update={"schema_file": tmp_path / "s.avsc"})}
    )
    keys = {k.key: k for k in resolve_feature_map(settings).sparse}
    assert (keys["category"].missing, keys["category"].missing_row) == (Missing.ROW, 39)
    assert (keys["recent"].missing, keys["recent"].missing_id) == (Missing.ID, 2999)
    assert keys["country"].missing_id == string_to_id("unknown")  # hashed as the field's values
    assert keys["shopper"].missing is Missing.EMPTY  # the default


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"missing_row": 3}, "missing_row is for missing = 'row' (missing is 'empty')"),
        ({"missing": "id", "missing_row": 3}, "missing_row is for missing = 'row'"),
        ({"missing": "row"}, "missing = 'row' needs missing_row"),
        ({"missing": "id"}, "missing = 'id' needs missing_id"),
        ({"missing_id": 3}, "missing_id is for missing = 'id' (missing is 'empty')"),
        ({"missing": "row", "missing_row": -1}, "missing_row = -1 must be >= 0"),
        ({"missing": "zero"}, "Input should be 'empty', 'row' or 'id'"),
    ],
)
def test_a_missing_policy_without_its_value_or_a_value_without_its_policy_is_refused(
    given: dict[str, Any], says: str
) -> None:
    with pytest.raises(pydantic.ValidationError) as error:
        SparseSettings(source="user", field="segment", **given)
    assert says in str(error.value)


def _module(settings: Settings, **changes: Any) -> Settings:
    """``settings`` with ``[model.module]`` changed (validated again)."""
    assert settings.model.module is not None
    module = type(settings.model.module)(**{**settings.model.module.model_dump(), **changes})
    return settings.model_copy(
        update={"model": settings.model.model_copy(update={"module": module})}
    )


def test_weighted_keys_resolve_with_their_weights() -> None:
    fmap = resolve_feature_map(_settings("weighted"))
    assert fmap.weighted and fmap.layout.weighted
    keys = {k.key: k for k in fmap.sparse}
    assert [k for k, v in keys.items() if v.weighted] == ["topics", "follows"]
    topics = next(f for f in fmap.event_fields if f.field.name == "topics")
    assert topics.weights is not None and topics.weights.name == "topic_minutes"
    assert (topics.key, topics.max_ids, topics.store) == ("topics", 6, Store.LISTS)
    assert fmap.user is not None
    follows, strength = fmap.user.field("follows"), fmap.user.field("follow_strength")
    assert (strength.kind, strength.width, strength.pairs) == (
        RecordKind.WEIGHTS,
        8,
        follows.column,
    )
    assert strength.column == 4 and fmap.user.count(RecordKind.VECTOR) == 12  # after profile
    assert fmap.user.weights_of(follows.column) == strength
    plain = resolve_feature_map(_settings("sequence"))
    assert not plain.weighted and plain.layout.ids_per_key == (1, 1, 1, 1, 10)


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"sparse__topics__weights": "topics"},
            "features.sparse.topics.weights = 'topics' is array<long>; a key's weights needs "
            "float_list",
        ),
        (
            {"sparse__reader__weights": "topic_minutes"},
            "features.sparse.reader.weights: weights pair with an array of ids, and reader.id is "
            "long",
        ),
        (
            {"sparse__topics__weights": "nowhere"},
            "features.sparse.topics.weights = 'nowhere': the event has no field 'nowhere'",
        ),
        (
            {"sparse__follows__weights": "profile"},
            "features.sparse.follows.weights = 'profile': weights pair with the key's id_list "
            "field; declare profile = 'weights:follows' in [features.user].fields",
        ),
        (
            {
                "user__fields": {
                    "profile": "vector:4",
                    "follows": "id_list:8",
                    "follow_strength": "weights:profile",
                }
            },
            "features.user.fields.follow_strength = 'weights:profile': weights pair with an "
            "id_list field of the record, and 'profile' is none",
        ),
        (
            {"sparse__follows__field": "follow_strength"},
            "features.sparse.follows.field = 'follow_strength' is a weights field: a sparse "
            "feature needs an id or an id_list",
        ),
        (
            {"dense": [{"source": "user", "field": "follow_strength"}]},
            "features.dense[0].field = 'follow_strength' is a weights field: a dense part needs "
            "a vector",
        ),
    ],
)
def test_a_weights_mistake_is_one_line_naming_the_key(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(FeatureMapError) as error:
        resolve_feature_map(_settings("weighted", **changes))
    assert says in str(error.value) and "\n" not in str(error.value)


def test_weights_need_a_weighted_pooled_collection() -> None:
    with pytest.raises(FeatureMapError) as error:
        resolve_feature_map(_module(_settings("weighted"), weighted=False))
    assert str(error.value) == (
        "features.sparse.topics.weights: model.module.weighted is false (the "
        "EmbeddingBagCollection takes no weights); set it, or drop weights"
    )
    settings = _module(_settings("sequence", sparse__history__weights="watched"), weighted=True)
    with pytest.raises(FeatureMapError) as error:
        resolve_feature_map(settings)
    assert "features.sparse.history.weights: t_history is a sequence table (an " in str(error.value)


def test_managed_keys_map_raw_ids_into_the_remappers_range() -> None:
    settings = _module(_settings("deepfm"), managed_collision={"input_hash_size": 1 << 20})
    keys = {k.key: k for k in resolve_feature_map(settings).sparse}
    assert {k.num_rows for k in keys.values()} == {1 << 20}
    with pytest.raises(FeatureMapError, match=r"segment.missing_row = 1048576: the table has"):
        resolve_feature_map(
            _settings(
                "deepfm", sparse__segment__missing="row", sparse__segment__missing_row=1 << 20
            ).model_copy(update={"model": settings.model})
        )
