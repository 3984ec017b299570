"""What the documents name exists: every repository path and ``pipeline.*``/``model.*`` module
(and the name in it) in a code span, every ``make`` target, and every link between the
documents, anchors included. A file moved or renamed without its documents fails here."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.pipeline.cli.documented_commands import DOCUMENTS, REPO_ROOT, _code_lines
from tests.pipeline.settings.test_readme_config import _names_a_key, settings_keys

TOP_FOLDERS = ("pipeline", "model", "tests", "scripts", "docker", "schemas", "docs", ".ci")
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(re.escape(f) for f in TOP_FOLDERS)})/[\w./-]*)")
MODULE = re.compile(r"(?<![\w.])((?:pipeline|model)(?:\.[A-Za-z_]\w*)+)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FILE_SUFFIXES = (".pt", ".json", ".md", ".png", ".toml", ".yaml", ".yml", ".npy", ".py")


def _name(document: Path) -> str:
    return document.relative_to(REPO_ROOT).as_posix()


def _spans(document: Path) -> list[tuple[str, str]]:
    """``(where, text)`` of every code span and code line of the document."""
    return [(f"{_name(document)}:{n}", text) for n, text in _code_lines(document.read_text())]


def named_paths() -> list[tuple[str, str]]:
    found = []
    for document in DOCUMENTS:
        for where, text in _spans(document):
            for path in PATH.findall(text):
                if not any(c in path for c in "<>*{"):
                    found.append((where, path.rstrip(".,:;")))
    return found


def named_modules() -> list[tuple[str, str]]:
    keys = set(settings_keys())
    found = []
    for document in DOCUMENTS:
        for where, text in _spans(document):
            for name in MODULE.findall(text):
                if name.endswith(FILE_SUFFIXES) or _names_a_key(name, keys):
                    continue  # model.pt, model.checkpoint
                found.append((where, name))
    return found


@cache
def _top_level_names(module_file: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.parse(module_file.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def _resolves(module: str) -> bool:
    """``pipeline.jobs.summaries.step_stats``: the longest prefix that is a module or package
    of ours, then (if anything is left) a name defined at its top level."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        base = REPO_ROOT.joinpath(*parts[:n])
        module_file = base.with_suffix(".py")
        source = module_file if module_file.is_file() else base / "__init__.py"
        if source.is_file():
            rest = parts[n:]
            return not rest or rest[0] in _top_level_names(source)
    return False


def links() -> list[tuple[str, Path, str]]:
    """``(where, target file, anchor)`` of every relative link of the documents."""
    found = []
    for document in DOCUMENTS:
        for number, line in enumerate(document.read_text().splitlines(), start=1):
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue  # http:, mailto:
                file, _, anchor = target.partition("#")
                path = (document.parent / file).resolve() if file else document
                found.append((f"{_name(document)}:{number}", path, anchor))
    return found


def _anchors(document: Path) -> set[str]:
    """GitHub's anchors of the document's headings."""
    headings = re.findall(r"^#+ (.+)$", document.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (REPO_ROOT / "Makefile").read_text(), re.M))


def test_the_scans_find_something() -> None:
    assert len(named_paths()) > 100 and len(named_modules()) > 3 and len(links()) > 20


@pytest.mark.parametrize(("where", "path"), named_paths(), ids=lambda v: str(v))
def test_every_named_path_exists(where: str, path: str) -> None:
    target = REPO_ROOT / path
    assert target.is_dir() if path.endswith("/") else target.exists(), f"{where}: no {path}"


@pytest.mark.parametrize(("where", "module"), named_modules(), ids=lambda v: str(v))
def test_every_named_module_exists(where: str, module: str) -> None:
    assert _resolves(module), f"{where}: no {module}"


@pytest.mark.parametrize(("where", "path", "anchor"), links(), ids=lambda v: str(v))
def test_every_link_resolves(where: str, path: Path, anchor: str) -> None:
    assert path.exists(), f"{where}: no {path}"
    if anchor:
        assert anchor in _anchors(path), f"{where}: no heading #{anchor} in {path.name}"


def test_every_make_target_named_exists() -> None:
    named = {
        (where, target)
        for document in DOCUMENTS
        for where, text in _spans(document)
        for target in re.findall(r"(?<![\w-])make ([a-z][\w-]*)", text)
    }
    assert named
    unknown = sorted(f"{where}: make {t}" for where, t in named if t not in make_targets())
    assert not unknown
