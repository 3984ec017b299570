"""The commands that BENCHMARKS.md and RELIABILITY.md give for their figures still exist: every
``pytest ... [-k EXPR]`` selects at least one test (one ``pytest --collect-only -q`` run with
pytest's own ``-k`` matching), and every ``python scripts/...`` names a script of the
repository. (Every ``streamrank ...`` line is parsed by tests/pipeline/cli/test_readme_commands.py.)
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline.cli.documented_commands import REPO_ROOT, _code_lines

MEASURED = [REPO_ROOT / "BENCHMARKS.md", REPO_ROOT / "RELIABILITY.md"]
FLAGS_WITH_VALUE = {"-k", "-m", "-p", "--timeout", "-o"}


def _commands(program: str, documents: list[Path]) -> list[tuple[str, list[str]]]:
    """``(where, words after program)`` of every ``program ...`` in the documents' code."""
    found = []
    for document in documents:
        name = document.relative_to(REPO_ROOT).as_posix()
        for number, line in _code_lines(document.read_text()):
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            for i, word in enumerate(words):
                if word == program or (program == "pytest" and words[i : i + 3] == [
                    "python", "-m", "pytest"
                ]):  # fmt: skip
                    start = i + (3 if word == "python" else 1)
                    found.append((f"{name}:{number}", words[start:]))
                    break
    return found


def pytest_selectors() -> list[tuple[str, str, str]]:
    """``(where, file, -k expression or "")`` of every ``pytest`` command of the measured
    documents (one entry per file it names)."""
    selectors = []
    for where, words in _commands("pytest", MEASURED):
        if not words or "..." in words:
            continue  # prose about the commands (``pytest ... -k``), not one of them
        files, expression, i = [], "", 0
        while i < len(words):
            if words[i] in FLAGS_WITH_VALUE:
                expression = words[i + 1] if words[i] == "-k" else expression
                i += 2
                continue
            if not words[i].startswith("-"):
                files.append(words[i])
            i += 1
        assert files, f"{where}: pytest without a test file"
        selectors.extend((where, file, expression) for file in files)
    return selectors


SELECTORS = pytest_selectors()


def test_the_measured_documents_give_pytest_commands() -> None:
    assert len(SELECTORS) >= 10, SELECTORS
    assert any(expression for _, _, expression in SELECTORS)


@pytest.fixture(scope="module")
def selected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """What each selector selects: one ``pytest --collect-only -q`` run over every file named."""
    files = sorted({file for _, file, _ in SELECTORS if (REPO_ROOT / file).is_file()})
    out = tmp_path_factory.mktemp("selectors") / "selected.json"
    env = {
        **os.environ,
        "DOC_SELECTORS": json.dumps(sorted({(f, e) for _, f, e in SELECTORS})),
        "DOC_SELECTED": str(out),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"),
            *("-p", "tests.docs.selector_plugin", *files),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return dict(json.loads(out.read_text()))


@pytest.mark.parametrize(
    ("where", "file", "expression"), SELECTORS, ids=[f"{w} {f} -k {e}" for w, f, e in SELECTORS]
)
def test_every_pytest_command_selects_a_test(
    where: str, file: str, expression: str, selected: dict[str, list[str]]
) -> None:
    assert (REPO_ROOT / file).is_file(), f"{where}: no {file}"
    chosen = selected[f"{file}::{expression}"]
    assert chosen, f"{where}: `pytest {file} -k {expression}` selects no test"


SCRIPTS = [*_commands("python", MEASURED), *_commands("python3", MEASURED)]


def test_the_measured_documents_name_scripts() -> None:
    assert any(words and words[0].startswith("scripts/") for _, words in SCRIPTS), SCRIPTS


@pytest.mark.parametrize(("where", "words"), SCRIPTS, ids=str)
def test_every_script_named_exists(where: str, words: list[str]) -> None:
    if words and words[0].endswith(".py"):
        assert (REPO_ROOT / words[0]).is_file(), f"{where}: no {words[0]}"
