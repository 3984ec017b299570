"""Resolving a configured model's retrieval: which vectors query and which are indexed, what the
examples resolve to, and what each mistake says (one line naming the key)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

from model.features.mapping import Source, Transform
from model.module.checks import managed_collisions, module_tables
from model.module.factory import build_module
from model.retrieval.sources import RecordVectors, TableVectors, VectorSource
from pipeline.models.preflight import configured_module
from pipeline.models.retrieval import RetrievalConfigError, resolve_retrieval, state_key
from pipeline.settings.loading import Settings, load_settings
from pipeline.settings.retrieval import RetrievalSettings
from tests.conftest import REPO_ROOT
from tests.integration.managed import managed_toml

EXAMPLES = REPO_ROOT / "examples"


def _settings(
    name: str | Path, item_fields: dict[str, str] | None = None, **retrieval: Any
) -> Settings:
    """The example's settings (``name``, or a TOML file of it) with ``[retrieval]`` replaced by
    ``retrieval`` (and its item record's fields by ``item_fields``)."""
    toml = name if isinstance(name, Path) else EXAMPLES / name / "streamrank.toml"
    settings = load_settings(toml)
    events = settings.events.model_copy(
        update={"schema_file": REPO_ROOT / str(settings.events.schema_file)}
    )
    features = settings.features
    if item_fields is not None and features.item is not None:
        item = features.item.model_copy(update={"fields": item_fields})
        features = features.model_copy(update={"item": item})
    return settings.model_copy(
        update={
            "events": events,
            "features": features,
            "retrieval": RetrievalSettings(**retrieval),
        }
    )


def _resolve(name: str | Path, item_fields: dict[str, str] | None = None, **retrieval: Any):  # type: ignore[no-untyped-def]
    settings = _settings(name, item_fields, **retrieval)
    config, fmap = configured_module(settings)
    probe = build_module(config, "meta", embedding_device="meta")
    return resolve_retrieval(settings, fmap, module_tables(probe), managed_collisions(probe))


def _table(name: str) -> dict[str, str]:
    return {"source": "table", "table": name}


def _field(source: str, name: str) -> dict[str, str]:
    return {"source": source, "field": name}


def test_tables_resolve_to_their_weights_and_the_keys_that_look_them_up() -> None:
    plan = _resolve("deepfm", query=_table("t_viewer"), items=_table("t_offer"))
    assert plan is not None
    assert isinstance(plan.query, TableVectors) and isinstance(plan.items, TableVectors)
    bags = "sparse_arch.embedding_bag_collection.embedding_bags"
    assert plan.query.state_key == f"{bags}.t_viewer.weight"
    assert plan.items.state_key == f"{bags}.t_offer.weight"
    assert (plan.query.num_rows, plan.query.dim) == (1000, 16)
    assert plan.query.key.key == "viewer" and plan.query.key.transform is Transform.MODULO
    assert plan.items.key.key == "offer" and plan.items.key.source is Source.CANDIDATE
    assert plan.catalogue_key == "shop:offer:{id}"
    assert plan.item_id_limit == _settings("deepfm").codec.max_id + 1
    assert plan.catalogue_rows == 0


def test_an_identity_table_is_its_own_catalogue_and_bounds_the_ids() -> None:
    plan = _resolve("dcn", query=_table("t_shopper"), items=_table("t_listing"), catalogue="table")
    assert plan is not None and isinstance(plan.items, TableVectors)
    assert plan.query.key.transform is Transform.HASH  # type: ignore[union-attr]
    assert plan.catalogue_rows == 3000
    assert plan.item_id_limit == 3000  # listing: identity, out_of_range = "dlq"


def test_redis_vector_fields_resolve_to_their_layouts() -> None:
    plan = _resolve(
        "deepfm",
        {"stats": "vector:2", "embedding": "vector:4"},  # a field the features do not read
        query=_field("user", "taste"),
        items=_field("item", "embedding"),
        catalogue="file",
        catalogue_path="items.txt",
    )
    assert plan is not None
    assert isinstance(plan.query, RecordVectors) and plan.query.side is VectorSource.USER
    assert plan.query.field.name == "taste" and plan.query.dim == 4
    assert plan.query.layout.key == "shop:viewer:{id}"
    assert isinstance(plan.items, RecordVectors) and plan.items.side is VectorSource.ITEM
    assert plan.items.field.column == 2  # after stats' two values


@pytest.mark.parametrize("name", ["deepfm", "dcn", "sequence", "weighted"])
def test_every_table_names_its_weights_in_the_module_state_dict(name: str) -> None:
    config, _ = configured_module(_settings(name))
    module = build_module(config, "meta", embedding_device="meta")
    state = module.state_dict()
    tables = module_tables(module)
    assert tables and all(state_key(t) in state for t in tables)
    assert name != "sequence" or any(".embeddings." in state_key(t) for t in tables)


def test_a_table_behind_a_managed_collision_remapper_is_refused(tmp_path: Path) -> None:
    toml = tmp_path / "managed.toml"
    toml.write_text(managed_toml((EXAMPLES / "deepfm" / "streamrank.toml").read_text()))
    with pytest.raises(RetrievalConfigError) as caught:
        _resolve(toml, query=_table("t_viewer"), items=_table("t_offer"))
    assert "retrieval.query.table = 't_viewer' is behind a managed-collision remapper" in str(
        caught.value
    )


def test_off_resolves_to_nothing() -> None:
    assert _resolve("deepfm", enabled=False, query=_table("nope")) is None


@pytest.mark.parametrize(
    ("name", "retrieval", "says"),
    [
        (
            "deepfm",
            {},
            "retrieval.enabled = true with [model.module] needs retrieval.query and "
            "retrieval.items",
        ),
        ("deepfm", {"query": _table("t_viewer")}, "needs retrieval.items: which vectors"),
        (
            "deepfm",
            {"query": _table("t_viewr"), "items": _table("t_offer")},
            "retrieval.query.table = 't_viewr': model.module has no such table (its tables: "
            "t_viewer, t_browser",
        ),
        (
            "deepfm",
            {"query": _table("t_browser"), "items": _table("t_offer")},
            "retrieval.query.table = 't_browser': no key of it is the user id "
            "(events.user_id = 'viewer.id'; its keys: browser (event viewer.browser))",
        ),
        (
            "deepfm",
            {"query": _table("t_viewer"), "items": _table("t_recent_offers")},
            "retrieval.items.table = 't_recent_offers': no candidate key looks it up (its "
            "keys: recent_offers (event))",
        ),
        (
            "deepfm",
            {"query": _field("user", "segment"), "items": _table("t_offer")},
            "retrieval.query.field = 'segment' is an id: retrieval needs a vector field",
        ),
        (
            "deepfm",
            {"query": _field("user", "tastes"), "items": _table("t_offer")},
            "retrieval.query.field = 'tastes': [features.user] declares no such field (its "
            "fields: taste, segment)",
        ),
        (
            "deepfm",
            {"query": _table("t_viewer"), "items": _field("item", "stats")},
            "retrieval.query: the query vectors are 16 wide (table t_viewer) but the indexed "
            "ones 2 (features.item.fields.stats = 'vector:2')",
        ),
        (
            "deepfm",
            {"query": _field("user", "taste"), "items": _field("item", "stats")},
            "the query vectors are 4 wide (features.user.fields.taste = 'vector:4') but the "
            "indexed ones 2",
        ),
        (
            "deepfm",
            {"query": _table("t_viewer"), "items": _table("t_offer"), "catalogue": "table"},
            'retrieval.catalogue = "table": features.sparse.offer turns ids into rows of '
            "t_offer by 'modulo', so a row is not an item id",
        ),
        (
            "dcn",
            {
                "query": _field("user", "profile"),
                "items": _field("item", "quality"),
                "catalogue": "table",
                "item_fields": {"category": "id", "quality": "vector:3"},
            },
            'retrieval.catalogue = "table" takes the rows of the index table as the item ids: '
            'it needs retrieval.items.source = "table"',
        ),
        (
            "deepfm",
            {
                "query": _table("t_viewer"),
                "items": _table("t_offer"),
                "query_features": ["user_id", "device"],
            },
            "retrieval.query_features: the built-in model's query",
        ),
    ],
    ids=[
        "neither",
        "no-items",
        "no-such-table",
        "query-table-not-by-user",
        "items-table-not-by-candidate",
        "query-field-not-a-vector",
        "query-field-undeclared",
        "table-and-field-widths",
        "field-widths",
        "table-catalogue-of-a-modulo-key",
        "table-catalogue-of-redis-items",
        "built-in-query-features",
    ],
)
def test_each_mistake_is_one_line_naming_its_key(
    name: str, retrieval: dict[str, Any], says: str
) -> None:
    with pytest.raises(RetrievalConfigError) as caught:
        _resolve(name, **retrieval)
    message = str(caught.value)
    assert says in message and "\n" not in message


@pytest.mark.parametrize(
    ("retrieval", "says"),
    [
        ({"query": {"source": "table"}}, 'source = "table" takes a table (and no field)'),
        ({"query": {"source": "user", "table": "t"}}, 'source = "user" takes a field'),
        ({"query": _field("item", "x")}, 'query.source = "item": the query is the user\'s'),
        ({"items": _field("user", "x")}, 'items.source = "user": the index holds items'),
        ({"query": {"source": "model"}}, "Input should be 'table', 'user' or 'item'"),
    ],
)
def test_settings_refuse_a_side_of_the_wrong_shape(retrieval: dict[str, Any], says: str) -> None:
    with pytest.raises(
        pydantic.ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")
    ):
        RetrievalSettings(**retrieval)
