"""The serving path never imports the tools (``pipeline.tools``) nor the CLI."""

from __future__ import annotations

import ast
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[3] / "pipeline"
OUTSIDE_SERVING = {PIPELINE / "tools", PIPELINE / "cli"}


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def test_serving_modules_do_not_import_tools_or_cli() -> None:
    serving = [
        path
        for path in PIPELINE.rglob("*.py")
        if not any(path.is_relative_to(folder) for folder in OUTSIDE_SERVING)
    ]
    assert serving
    for path in serving:
        bad = {
            m for m in _imported_modules(path) if m.startswith(("pipeline.tools", "pipeline.cli"))
        }
        assert not bad, f"{path.relative_to(PIPELINE.parent)} imports {sorted(bad)}"
