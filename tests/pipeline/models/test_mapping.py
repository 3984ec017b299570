"""Resolving a feature map: what each mistake says (one line naming the key) and what the
examples resolve to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from model.features.mapping import Store
from pipeline.models.mapping import FeatureMapError, resolve_feature_map
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
            "features.item.fields.category = 'id:2': expected 'vector:N', 'id' or 'id_list:N'",
        ),
        ({"dense": []}, "features.dense: declare at least one"),
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
