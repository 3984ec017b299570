"""docs/configuration.md's table lists every setting, no unknown one, with its real default; and
every key or ``STREAMRANK_<SECTION>__<KEY>`` variable that README.md or docs/ names exists."""

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

REPO_ROOT = Path(__file__).resolve().parents[3]
CONFIGURATION = REPO_ROOT / "docs" / "configuration.md"
DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
FILE_SUFFIXES = (".pt", ".json", ".py", ".md", ".png", ".toml", ".yaml", ".yml", ".npy")
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
    """docs/configuration.md's table: ``{key: (default cell, description)}``."""
    text = CONFIGURATION.read_text()
    section = text[text.index("## Every key") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
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
    assert not missing, f"settings missing from docs/configuration.md's table: {missing}"
    assert not unknown, f"docs/configuration.md documents keys that do not exist: {unknown}"


def test_documented_defaults_are_the_real_ones() -> None:
    keys = settings_keys()
    for key, (cell, description) in documented().items():
        model, name = keys[key]
        default = _plain(getattr(model(), name))
        if cell == "unset":
            assert default is None, f"{key}: the docs say unset, the default is {default!r}"
            continue
        written = tomllib.loads(f"value = {cell.strip('`')}")["value"]
        # The documented value, read as a user's TOML would be, gives the default.
        assert _plain(getattr(model.model_validate({name: written}), name)) == default, key
        assert description.strip(), f"{key}: no description"


def test_the_table_is_one_table_and_keys_are_in_section_order() -> None:
    order = list(documented())
    sections = list(dict.fromkeys(key.split(".")[0] for key in order))
    assert sections == list(Settings.model_fields)


def _is_module_or_file(name: str) -> bool:
    """``model.features.build`` (a module of ours) or ``model.pt`` (a file name)."""
    if name.endswith(FILE_SUFFIXES):
        return True
    parts = name.split(".")
    return any(
        REPO_ROOT.joinpath(*parts[:n]).with_suffix(".py").is_file()
        or REPO_ROOT.joinpath(*parts[:n]).is_dir()
        for n in range(2, len(parts) + 1)
    )


def _names_a_key(mention: str, keys: set[str]) -> bool:
    """``mention`` is a key, or a section or table of keys (``model.sharding``); a ``<name>``
    of a key stands for any name (``model.sharding.tables.item_id.ranks``)."""
    parts = mention.split(".")
    for key in keys:
        key_parts = key.split(".")
        if len(parts) <= len(key_parts) and all(
            k == "<name>" or k == p for k, p in zip(key_parts, parts, strict=False)
        ):
            return True
    return False


def mentioned_keys() -> list[tuple[str, str]]:
    """``(where, key)`` for every key README.md and docs/ name in code spans: ``batching.x``,
    ``batching.x = 3``, ``[model.sharding]``, ``STREAMRANK_BATCHING__X=3``."""
    sections = set(Settings.model_fields)
    found = []
    for document in DOCUMENTS:
        for number, line in enumerate(document.read_text().splitlines(), start=1):
            where = f"{document.relative_to(REPO_ROOT)}:{number}"
            for span in re.findall(r"`([^`\n]+)`", line):
                for var in re.findall(r"\bSTREAMRANK_([A-Z_]+__[A-Z_]+)", span):
                    found.append((where, var.lower().replace("__", ".")))
                match = re.fullmatch(r"\[?([a-z_]+(?:\.[a-z_<>]+)+)\]?(?: = .*)?", span.strip())
                name = match.group(1) if match else ""
                if name.split(".")[0] in sections and not _is_module_or_file(name):
                    found.append((where, name))
    return found


def test_every_key_the_docs_name_exists() -> None:
    keys = set(settings_keys())
    mentions = mentioned_keys()
    assert len(mentions) > 50, "the docs name keys: the scan finds none"
    unknown = [f"{where}: {key}" for where, key in mentions if not _names_a_key(key, keys)]
    assert not unknown, f"keys the docs name that do not exist: {unknown}"
