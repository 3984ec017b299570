"""The shape of the code, checked against docs/architecture.md: every import between folders
goes the way the page's table allows, and every import of a client library (Kafka, Redis, torch,
Faiss) comes from a folder its table allows; stages import no other stage; nothing calls back
into the loop; no test hook in the serving packages; no import cycle."""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
TABLE_SECTION = "## Which folder may import which"
LIBRARY_SECTION = "## Which folder may import which client library"
STAGES = ROOT / "pipeline" / "stages"
SERVING = [ROOT / "pipeline", ROOT / "model"]
OUR_PACKAGES = ("pipeline", "model")
ROW = re.compile(r"^\| `([^`]+)` \| (.+) \|$")


def _table(heading: str) -> dict[str, frozenset[str]]:
    """The table under ``heading``: its rows' first cell -> the backticked names of the second
    (empty for ``none``)."""
    text = ARCHITECTURE.read_text()
    section = text[text.index(heading + "\n") + len(heading) :]
    section = section[: section.find("\n## ")] if "\n## " in section else section
    rows: dict[str, frozenset[str]] = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match is None:
            continue
        first, cell = match.groups()
        assert first not in rows, f"{first} has two rows"
        may = frozenset() if cell.strip() == "none" else frozenset(re.findall(r"`([^`]+)`", cell))
        rows[first] = may
    assert rows, f"no table under {heading!r} in {ARCHITECTURE}"
    return rows


@cache
def import_table() -> dict[str, frozenset[str]]:
    """The page's table: ``{"pipeline/stages/": {"pipeline/types.py", ...}, "model/": {}}``.

    A row's first cell is a folder (``.../``) or a module (``....py``); its second lists, in
    backticks, what that folder may import, or says ``none``.
    """
    return _table(TABLE_SECTION)


@cache
def library_table() -> dict[str, frozenset[str]]:
    """The page's table of client libraries: ``{"confluent_kafka": {"pipeline/connectors/kafka/",
    ...}, ...}``: the folders and modules that may import each one (anything under them)."""
    return _table(LIBRARY_SECTION)


def _covers(entry: str, path: str) -> bool:
    """Whether a table entry (a folder ``a/b/`` or a module ``a/b.py``) covers ``path``."""
    return path == entry or (entry.endswith("/") and path.startswith(entry))


def row_of(path: str) -> str | None:
    """The most specific row of the table that covers ``path``, or ``None``."""
    covering = [entry for entry in import_table() if _covers(entry, path)]
    return max(covering, key=len) if covering else None


def _path_of(module: str) -> str | None:
    """``pipeline.stages.decode`` -> ``pipeline/stages/decode.py``; a package -> its folder
    (``pipeline/stages/commit/``); a name inside a module -> that module; else ``None``."""
    parts = module.split(".")
    while parts:
        base = ROOT.joinpath(*parts)
        if base.with_suffix(".py").is_file():
            return "/".join(parts) + ".py"
        if (base / "__init__.py").is_file():
            return "/".join(parts) + "/"
        parts = parts[:-1]
    return None


def _imported_modules(path: Path) -> set[str]:
    """Every ``pipeline.*``/``model.*`` name imported anywhere in the module (functions and
    ``TYPE_CHECKING`` blocks included): ``from a.b import c`` gives ``a.b`` and ``a.b.c``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in OUR_PACKAGES}


def imported_paths(path: Path) -> set[str]:
    """The files and folders of ours that the module at ``path`` imports."""
    paths = {_path_of(name) for name in _imported_modules(path)}
    return {p for p in paths if p is not None}


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


SOURCE_FILES = sorted(p for package in SERVING for p in package.rglob("*.py"))


def _between_rows(path: Path) -> bool:
    """A package module that no row covers (``pipeline/__init__.py``,
    ``pipeline/connectors/__init__.py``): it holds the folder's docstring and imports nothing."""
    return path.name == "__init__.py" and row_of(_relative(path)) is None


def test_the_table_names_real_folders_and_is_one_way() -> None:
    table = import_table()
    for entry in {*table, *(a for allowed in table.values() for a in allowed)}:
        target = ROOT / entry
        assert target.is_dir() if entry.endswith("/") else target.is_file(), f"no {entry}"
    # One way: no folder may import, directly or through others, a folder that may import it.
    edges = {
        row: {other for other in table if other != row and any(_covers(a, other) for a in may)}
        for row, may in table.items()
    }

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt}))
            for nxt in edges[start]
        )

    cycles = sorted(row for row in table if reaches(row, row, {row}))
    assert not cycles, f"the table allows a cycle through {cycles}"
    assert table["model/"] == frozenset(), "model/ never imports pipeline/"


def test_every_module_has_a_row() -> None:
    missing = sorted(
        _relative(p) for p in SOURCE_FILES if row_of(_relative(p)) is None and not _between_rows(p)
    )
    assert not missing, f"modules without a row in {ARCHITECTURE.name}: {missing}"


def test_at_most_three_modules_besides_types_directly_in_pipeline() -> None:
    top = {p.name for p in (ROOT / "pipeline").glob("*.py")} - {"__init__.py", "types.py"}
    assert len(top) <= 3, top
    assert all(f"pipeline/{name}" in import_table() for name in top), top


@pytest.mark.parametrize("path", SOURCE_FILES, ids=_relative)
def test_imports_go_the_way_the_table_allows(path: Path) -> None:
    if _between_rows(path):
        assert not imported_paths(path), f"{_relative(path)} (a folder's docstring) imports"
        return
    source = row_of(_relative(path))
    assert source is not None, f"{_relative(path)} has no row in {ARCHITECTURE.name}"
    allowed = import_table()[source]
    wrong = sorted(
        target
        for target in imported_paths(path)
        if row_of(target) != source and not any(_covers(a, target) for a in allowed)
    )
    assert not wrong, f"{_relative(path)} ({source}) imports {wrong}; allowed: {sorted(allowed)}"


def _imported_libraries(source: str) -> set[str]:
    """The client libraries of :func:`library_table` that ``source`` imports (anywhere in it,
    functions and ``TYPE_CHECKING`` blocks included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found & library_table().keys()


def library_violations(path: str, source: str) -> list[str]:
    """The client libraries the module at ``path`` (relative to the root) imports and may not."""
    return sorted(
        library
        for library in _imported_libraries(source)
        if not any(_covers(allowed, path) for allowed in library_table()[library])
    )


def test_the_library_table_names_the_libraries_and_real_folders() -> None:
    table = library_table()
    assert set(table) == {"confluent_kafka", "redis", "torch", "faiss"}
    for allowed in table.values():
        for entry in allowed:
            target = ROOT / entry
            assert target.is_dir() if entry.endswith("/") else target.is_file(), f"no {entry}"


@pytest.mark.parametrize("path", SOURCE_FILES, ids=_relative)
def test_client_libraries_are_imported_only_where_the_table_allows(path: Path) -> None:
    wrong = library_violations(_relative(path), path.read_text())
    assert not wrong, f"{_relative(path)} imports {wrong}; see {LIBRARY_SECTION!r}"


@pytest.mark.parametrize(
    "statement",
    [
        "from confluent_kafka import Message",
        "import confluent_kafka",
        "from confluent_kafka.admin import AdminClient",
        "import redis",
        "if TYPE_CHECKING:\n    from confluent_kafka import TopicPartition",
        "def f():\n    import redis.exceptions",
    ],
)
def test_a_stage_or_the_loop_importing_a_client_fails_the_check(statement: str) -> None:
    edge = statement.replace("redis", "confluent_kafka")
    assert not library_violations("pipeline/connectors/kafka/consumer.py", edge)
    stages_and_loop = [
        "pipeline/stages/source.py",
        "pipeline/stages/commit/protocol.py",
        "pipeline/stages/enrich/enricher.py",
        "pipeline/runtime/loop.py",
        "pipeline/types.py",
    ]
    for path in stages_and_loop:
        assert library_violations(path, statement), f"{statement!r} allowed in {path}"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _stage_of(module: str) -> str | None:
    """``pipeline.stages.commit.protocol`` -> ``commit``; ``None`` outside the stages."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["pipeline", "stages"] else None


STAGE_FILES = sorted(
    p for p in STAGES.rglob("*.py") if p.name != "__init__.py" or p.parent != STAGES
)


@pytest.mark.parametrize("path", STAGE_FILES, ids=_relative)
def test_a_stage_imports_no_other_stage(path: Path) -> None:
    own = _stage_of(_module(path))
    others = {
        name
        for name in _imported_modules(path)
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
        if "pipeline.runtime.loop" in _imported_modules(p) and "tools" not in p.parts
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


def _module_file(name: str) -> Path | None:
    """The file that ``import name`` (or ``from a.b import name``) runs last: a module's file, a
    package's ``__init__.py``, or ``None`` outside our packages."""
    path = _path_of(name)
    if path is None:
        return None
    return ROOT / (path + "__init__.py" if path.endswith("/") else path)


def import_cycles() -> list[list[str]]:
    """The strongly connected groups of two or more modules in the graph of every import of ours
    (module level, in functions, under ``TYPE_CHECKING``): each one is an import cycle."""
    graph = {
        path: {
            f for name in _imported_modules(path) if (f := _module_file(name)) not in (None, path)
        }
        for path in SOURCE_FILES
    }
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    cycles: list[list[str]] = []

    def visit(node: Path) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                group.append(member)
            group.append(node)
            if len(group) > 1:
                cycles.append(sorted(_relative(p) for p in group))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycle() -> None:
    assert not import_cycles()


def test_the_cycle_check_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("from pipeline.types import Batch\n")
    second.write_text("from pipeline.types import Batch\n")
    files = {"pipeline.first": first, "pipeline.second": second}
    monkeypatch.setattr(
        sys.modules[__name__],
        "_imported_modules",
        lambda path: {"pipeline.second"} if path == first else {"pipeline.first"},
    )
    monkeypatch.setattr(sys.modules[__name__], "_module_file", files.get)
    monkeypatch.setattr(sys.modules[__name__], "SOURCE_FILES", [first, second])
    monkeypatch.setattr(sys.modules[__name__], "_relative", lambda path: path.name)
    assert import_cycles() == [["first.py", "second.py"]]
