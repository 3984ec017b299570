"""A pytest plugin that reports which tests each ``-k`` selector of the documents selects.

Loaded by ``tests/docs/test_measured_commands.py`` into one ``pytest --collect-only -q`` run of
the files the documents name: ``$DOC_SELECTORS`` is a JSON list of ``[file, expression]`` (an
empty expression: the whole file), and the plugin writes ``{"file::expression": [node ids]}``
to ``$DOC_SELECTED`` with pytest's own ``-k`` matching (the keyword matcher and expression
parser that ``-k`` uses), so one collection answers every selector.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _pytest.mark import KeywordMatcher
from _pytest.mark.expression import Expression


def pytest_collection_modifyitems(session: pytest.Session, items: list[pytest.Item]) -> None:
    selectors = json.loads(os.environ["DOC_SELECTORS"])
    root = Path(session.config.rootpath)
    selected: dict[str, list[str]] = {}
    for file, expression in selectors:
        in_file = [i for i in items if Path(i.path).resolve() == (root / file).resolve()]
        if expression:
            compiled = Expression.compile(expression)
            in_file = [i for i in in_file if compiled.evaluate(KeywordMatcher.from_item(i))]
        selected[f"{file}::{expression}"] = [i.nodeid for i in in_file]
    Path(os.environ["DOC_SELECTED"]).write_text(json.dumps(selected))
