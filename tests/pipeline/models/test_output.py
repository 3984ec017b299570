"""Resolving the output contract (``[output]``): what each mistake says (one line naming the
key), and what the DCN example's documented section resolves to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import pytest

from model.features.mapping import Store
from pipeline.connectors.avro.write_program import ECHO, ITEMS, TASK_F4, TASK_F8
from pipeline.models.mapping import FeatureMapError, resolve_feature_map
from pipeline.models.output import OutputContractError, published_columns, resolve_output
from pipeline.models.preflight import configured_module
from pipeline.settings.loading import Settings, load_settings
from pipeline.settings.output import OutputSettings
from tests.conftest import REPO_ROOT
from tests.integration.byom import documented_output

EXAMPLES = REPO_ROOT / "examples"
RANKING = json.loads((EXAMPLES / "dcn" / "listing_ranking.avsc").read_text())


def _settings(output: dict[str, Any], name: str = "dcn", **module: Any) -> Settings:
    settings = load_settings(EXAMPLES / name / "streamrank.toml")
    events = settings.events.model_copy(
        update={"schema_file": REPO_ROOT / str(settings.events.schema_file)}
    )
    update: dict[str, Any] = {"events": events, "output": OutputSettings(**output)}
    if module:
        assert settings.model.module is not None
        changed = settings.model.module.model_copy(update=module)
        update["model"] = settings.model.model_copy(update={"module": changed})
    return settings.model_copy(update=update)


def _resolve(settings: Settings) -> Any:
    return resolve_output(settings, resolve_feature_map(settings))


def _schema(tmp_path: Path, change: Any) -> str:
    """The example's output schema, changed by ``change(schema)``, in a file of its own."""
    schema = json.loads(json.dumps(RANKING))
    change(schema)
    path = tmp_path / f"{change.__name__}.avsc"
    path.write_text(json.dumps(schema))
    return str(path)


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f["name"] == name)


def test_the_documented_section_resolves_to_its_task_columns_and_echoes() -> None:
    settings = _settings(documented_output())
    contract = _resolve(settings)
    assert contract.task_names == ("click", "purchase")
    assert published_columns(settings) == (0, 1)
    codes = contract.program.ops[:, 0].tolist()
    assert codes.count(ITEMS) == 1 and codes.count(ECHO) == 3
    assert TASK_F8 in codes and TASK_F4 in codes  # p_click a double, p_purchase a float
    config, fmap = configured_module(settings)
    assert config.output.task_columns == (0, 1)
    assert config.output.column_names == ("click", "purchase")
    raw = [f.field.name for f in fmap.event_fields if f.store is Store.RAW]
    assert raw == ["session.country", "session.device", "price_ceiling"]


def test_without_a_schema_the_built_in_recommendation_is_written() -> None:
    contract = resolve_output(_settings({}))
    assert contract.program is None and contract.schema_file.name == "recommendation.avsc"


def _mistake(tmp_path: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One mistake: (changes to the documented section, changes to [model.module])."""
    doc = documented_output()
    cases: dict[str, Any] = {
        "missing-file": lambda: ({"schema_file": str(tmp_path / "none.avsc")}, {}),
        "not-a-record": lambda: ({"schema_file": _enum_schema(tmp_path)}, {}),
        "no-such-field": lambda: ({"model_version": "modelx"}, {}),
        "no-such-item-field": lambda: ({"scores": "ranked.points"}, {}),
        "wrong-type": lambda: ({"model_version": "", "fallback_features": "model"}, {}),
        "per-event-in-items": lambda: ({"model_version": "ranked.score", "scores": ""}, {}),
        "per-item-outside": lambda: ({"scores": "channel"}, {}),
        "same-field": lambda: ({"scores": "ranked.p_click"}, {}),
        "unknown-task": lambda: (
            {"task_scores": {**doc["task_scores"], "views": "ranked.score"}}, {},
        ),
        "unnamed-columns": lambda: ({}, {"output_names": []}),
        "unfilled-field": lambda: ({"user_id": ""}, {}),
        "echo-type": lambda: ({"echo": {"country": "want"}}, {}),
        "echo-nullable": lambda: ({"schema_file": _schema(tmp_path, _plain_double)}, {}),
        "echo-enum-symbols": lambda: ({"schema_file": _schema(tmp_path, _other_symbols)}, {}),
        "micros": lambda: ({"schema_file": _schema(tmp_path, _micros)}, {}),
        "bad-default": lambda: ({"schema_file": _schema(tmp_path, _bad_default)}, {}),
        "two-records-in-a-union": lambda: ({"schema_file": _schema(tmp_path, _two_records)}, {}),
        "items-the-records": lambda: ({"items": "ranked"}, {}),
    }  # fmt: skip
    made: tuple[dict[str, Any], dict[str, Any]] = cases[name]()
    return made


def _enum_schema(tmp_path: Path) -> str:
    path = tmp_path / "enum.avsc"
    path.write_text('{"type": "enum", "name": "E", "symbols": ["A"]}')
    return str(path)


def _other_symbols(schema: dict[str, Any]) -> None:
    _field(schema, "device")["type"]["symbols"] = ["WEB", "IOS", "ANDROID"]


def _micros(schema: dict[str, Any]) -> None:
    _field(schema, "ranked_at")["type"]["logicalType"] = "timestamp-micros"


def _bad_default(schema: dict[str, Any]) -> None:
    _field(schema, "channel")["default"] = 7


def _plain_double(schema: dict[str, Any]) -> None:
    _field(schema, "price_ceiling").update(type="double", default=0.0)


def _two_records(schema: dict[str, Any]) -> None:
    items = _field(schema, "ranked")["type"]
    other = {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "long"}]}
    _field(schema, "ranked")["type"] = [items, {"type": "array", "items": other}]


MISTAKES = {
    "missing-file": ("output.schema_file", "none.avsc"),
    "not-a-record": ("output.schema_file", "the output must be a record schema"),
    "no-such-field": ("output.model_version = 'modelx'", "the output has no field 'modelx'"),
    "no-such-item-field": ("output.scores = 'ranked.points'", "ranked has no field 'points'"),
    "wrong-type": ("output.fallback_features = 'model' is string", "needs array<string> or"),
    "per-event-in-items": ("output.model_version = 'ranked.score'", "one per event"),
    "per-item-outside": ("output.scores = 'channel' is string", "one value per item needs"),
    "same-field": ("output.task_scores.click = 'ranked.p_click'", "output.scores names the same"),
    "unknown-task": ("output.task_scores.views", "output_names has no column 'views'"),
    "unnamed-columns": ("output.task_scores.click", "it is empty"),
    "unfilled-field": ("output.schema_file", "'shopper_id' (long) has no default", "no role"),
    "echo-type": ("output.echo.country = 'want'", "the event's field is int", "is string"),
    "echo-nullable": ("output.echo.price_ceiling = 'price_ceiling'", "may be null", "may not"),
    "echo-enum-symbols": ("output.echo.device = 'session.device'", "the same symbols"),
    "micros": ("output.scored_at = 'ranked_at'", "epoch milliseconds"),
    "bad-default": ("output.schema_file", "Default value <7> must match"),
    "two-records-in-a-union": ("output.items = 'ranked.listing_id'", "ranked is [array<"),
    "items-the-records": ("output.items = 'ranked' is record RankedListing", "items needs long"),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_each_mistake_is_one_line_naming_the_key(tmp_path: Path, name: str) -> None:
    output, module = _mistake(tmp_path, name)
    settings = _settings({**documented_output(), **output}, **module)
    with pytest.raises((OutputContractError, FeatureMapError)) as raised:
        configured_module(settings)
        _resolve(settings)
    message = str(raised.value)
    assert "\n" not in message
    for fragment in MISTAKES[name]:
        assert fragment in message, message


def test_an_echo_of_a_field_the_event_lacks_names_the_key() -> None:
    settings = _settings({**documented_output(), "echo": {"country": "session.region"}})
    with pytest.raises(FeatureMapError, match=r"output\.echo\.country = 'session\.region'"):
        resolve_feature_map(settings)


def test_the_built_in_model_takes_an_output_schema_without_task_scores_or_echoes(
    tmp_path: Path,
) -> None:
    doc = {**documented_output(), "echo": {}, "task_scores": {}}
    with pytest.raises(OutputContractError, match=r"'country' \(string\) has no default"):
        resolve_output(Settings(output=OutputSettings(**doc)))  # the echoes' fields unfilled

    def defaults(schema: dict[str, Any]) -> None:
        _field(schema, "country")["default"] = "DE"
        _field(schema, "device")["default"] = "WEB"
        for item in _field(schema, "ranked")["type"]["items"]["fields"][2:]:
            item["default"] = 0.0  # p_click, p_purchase: the built-in model has one column

    builtin = Settings(output=OutputSettings(**{**doc, "schema_file": _schema(tmp_path, defaults)}))
    assert resolve_output(builtin).program is not None
    with pytest.raises(OutputContractError, match=r"output\.task_scores\.click: the built-in"):
        published_columns(Settings(output=OutputSettings(**{**documented_output(), "echo": {}})))
    echoes = {**documented_output(), "task_scores": {}}
    with pytest.raises(OutputContractError, match=r"output\.echo\.country: echoed fields are read"):
        resolve_output(Settings(output=OutputSettings(**echoes)))


@pytest.mark.parametrize(
    ("output", "fragment"),
    [
        ({"items": "ranked.listing_id"}, "output.items is set but output.schema_file is not"),
        ({"schema_file": "x.avsc"}, "output.items must name the field"),
        ({"schema_file": "x.avsc", "items": "a", "echo": {"b": ""}}, "both sides must name"),
    ],
)
def test_the_section_itself_refuses_roles_without_a_schema(
    output: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(pydantic.ValidationError, match=fragment):
        OutputSettings(**output)
