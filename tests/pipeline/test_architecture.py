"""The shape of the serving code, checked: stages import types, not each other; nothing calls
back into the loop; no test hook in the serving packages; modules stay small."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = ROOT / "pipeline" / "stages"
SERVING = [ROOT / "pipeline", ROOT / "model"]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _stage_of(module: str) -> str | None:
    """``pipeline.stages.commit.protocol`` -> ``commit``; ``None`` outside the stages."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["pipeline", "stages"] else None


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


STAGE_FILES = sorted(
    p for p in STAGES.rglob("*.py") if p.name != "__init__.py" or p.parent != STAGES
)


@pytest.mark.parametrize("path", STAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_stage_imports_no_other_stage(path: Path) -> None:
    own = _stage_of(_module(path))
    others = {
        name
        for name in _imports(path)
        if _stage_of(name) not in (None, own) and name != "pipeline.stages"
    }
    assert not others, f"{path.name} imports other stages: {sorted(others)}"


def test_the_stages_are_the_data_flow() -> None:
    stages = {p.stem for p in STAGES.glob("*.py") if p.stem != "__init__"}
    stages |= {p.name for p in STAGES.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert stages == {
        "source", "decode", "batch", "enrich", "features", "score", "publish", "dead_letter",
        "commit",
    }  # fmt: skip


def test_nothing_calls_back_into_the_loop() -> None:
    """No method of the loop is handed to another object (a callback back up)."""
    tree = ast.parse((ROOT / "pipeline" / "runtime" / "loop.py").read_text())
    (loop,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ScoringPipeline"]
    methods = {n.name for n in loop.body if isinstance(n, ast.FunctionDef)}
    handed = []
    for call in ast.walk(loop):
        if not isinstance(call, ast.Call):
            continue
        for arg in [*call.args, *(k.value for k in call.keywords)]:
            if (
                isinstance(arg, ast.Attribute)
                and isinstance(arg.value, ast.Name)
                and arg.value.id == "self"
                and arg.attr in methods
            ):
                handed.append(arg.attr)
    assert not handed, f"the loop hands out its methods: {handed}"
    importers = [
        p
        for p in (ROOT / "pipeline").rglob("*.py")
        if "pipeline.runtime.loop" in _imports(p) and "tools" not in p.parts
    ]
    assert {p.name for p in importers} == {"serve.py"}


def test_the_loop_reads_in_data_flow_order() -> None:
    body = (ROOT / "pipeline" / "runtime" / "loop.py").read_text()
    loop = body[body.index("def _loop(") : body.index("def _fill_batch(")]
    steps = [m.group(1) for m in re.finditer(r"# (consume|decode -> batch|process|commit)\b", loop)]
    assert steps == ["consume", "decode -> batch", "process", "commit"]


def test_no_test_hook_in_the_serving_packages() -> None:
    hooks = []
    for package in SERVING:
        for path in package.rglob("*.py"):
            text = path.read_text()
            if "STREAMRANK_TEST" in text or re.search(r"\bTEST HOOK\b", text):
                hooks.append(str(path.relative_to(ROOT)))
    assert not hooks


def test_rank_variables_are_read_in_one_place() -> None:
    readers = []
    pattern = re.compile(r"(?:get\(|\[)[\"'](RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE)[\"']")
    for package in SERVING:
        for path in package.rglob("*.py"):
            if pattern.search(path.read_text()):
                readers.append(str(path.relative_to(ROOT)))
    # model.rank reads them for the entry point; the process-group helper falls back on them
    # for ranks spawned by tests and tools (the serving path passes them explicitly).
    assert sorted(readers) == ["model/distributed/process_group.py", "model/rank.py"]


def test_no_module_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for package in SERVING
        for p in package.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long
