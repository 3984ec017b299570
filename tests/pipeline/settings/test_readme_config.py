"""README's Configuration table lists every setting, no unknown one, with its real default."""

from __future__ import annotations

import re
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

from pipeline.settings.loading import Settings
from pipeline.tools.synthetic_settings import SyntheticSettings

TOOL_SECTIONS: dict[str, type[BaseModel]] = {"synthetic": SyntheticSettings}
"""Sections ``run`` keeps as written, validated by the tools that read them."""

README = Path(__file__).resolve().parents[3] / "README.md"
ROW = re.compile(r"^\| `([a-z_.<>]+)` \| (unset|`[^`]*`) \| (.+) \|$")


def settings_keys(model: type[BaseModel] = Settings, prefix: str = "") -> dict[str, Any]:
    """Every key of ``model``, sections walked (``tables.<name>`` for per-name sections):
    ``{"kafka.linger_ms": (KafkaSettings, "linger_ms"), ...}``."""
    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        annotation = field.annotation
        args = typing.get_args(annotation)
        if not prefix and name in TOOL_SECTIONS:
            keys.update(settings_keys(TOOL_SECTIONS[name], f"{name}."))
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.update(settings_keys(annotation, f"{prefix}{name}."))
        elif (
            typing.get_origin(annotation) is dict
            and isinstance(args[1], type)
            and issubclass(args[1], BaseModel)
        ):
            keys.update(settings_keys(args[1], f"{prefix}{name}.<name>."))
        else:
            keys[f"{prefix}{name}"] = (model, name)
    return keys


def documented() -> dict[str, tuple[str, str]]:
    """README's Configuration table: ``{key: (default cell, description)}``."""
    text = README.read_text()
    section = text[text.index("## Configuration") : text.index("## Metrics")]
    rows = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


def _plain(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return getattr(value, "value", value)  # enums


def test_every_setting_is_documented_and_nothing_else() -> None:
    keys, rows = set(settings_keys()), set(documented())
    missing, unknown = keys - rows, rows - keys
    assert not missing, f"settings missing from README's Configuration table: {missing}"
    assert not unknown, f"README documents keys that do not exist: {unknown}"


def test_documented_defaults_are_the_real_ones() -> None:
    keys = settings_keys()
    for key, (cell, description) in documented().items():
        model, name = keys[key]
        default = _plain(getattr(model(), name))
        if cell == "unset":
            assert default is None, f"{key}: README says unset, the default is {default!r}"
            continue
        written = tomllib.loads(f"value = {cell.strip('`')}")["value"]
        # The documented value, read as a user's TOML would be, gives the default.
        assert _plain(getattr(model.model_validate({name: written}), name)) == default, key
        assert description.strip(), f"{key}: no description"


def test_the_table_is_one_table_and_keys_are_in_section_order() -> None:
    order = list(documented())
    sections = list(dict.fromkeys(key.split(".")[0] for key in order))
    assert sections == list(Settings.model_fields)
