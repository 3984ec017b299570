"""The single-process path never imports ``torchrec.distributed``: only model/distributed does.

Checked on our own import graph (an AST scan of model/ and pipeline/config.py, following our
modules transitively), not on ``sys.modules``: ``import torchrec`` itself may pull in
``torchrec.distributed``, which is TorchRec's business, not ours. Imports under
``if TYPE_CHECKING:`` do not run and are skipped.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import model.distributed

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = "torchrec.distributed"
#: Modules of model/distributed that the single-process path may import: the lazy package
#: module and the torch-free config (for configuration loading).
LIGHT_DISTRIBUTED = {"model.distributed", "model.distributed.config"}
LAZY_EXPORTS: dict[str, str] = model.distributed._EXPORTS


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _with_parents(name: str) -> set[str]:
    """``a.b.c`` -> ``{a, a.b, a.b.c}``: importing a module runs its packages first."""
    parts = name.split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))}


def _from_import(module: str, name: str) -> str:
    """What ``from module import name`` loads; a lazy re-export of model.distributed loads the
    submodule that defines the name."""
    if module == "model.distributed" and name in LAZY_EXPORTS:
        return f"model.distributed.{LAZY_EXPORTS[name]}"
    return f"{module}.{name}"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path) -> set[str]:
    """Absolute names imported by the module at ``path`` (outside ``if TYPE_CHECKING:``)."""
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.update(_with_parents(alias.name))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.update(_with_parents(node.module))
                found.update(_from_import(node.module, alias.name) for alias in node.names)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])

    visit(ast.parse(path.read_text()).body)
    return found


def _our_modules() -> dict[str, Path]:
    paths = [*ROOT.joinpath("model").rglob("*.py"), *ROOT.joinpath("pipeline").rglob("*.py")]
    return {_module_name(p): p for p in paths}


OURS = _our_modules()


def _closure(start: str) -> set[str]:
    """Every name ``start`` imports, directly or through our modules."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        for parent in _with_parents(name):
            if parent in seen:
                continue
            seen.add(parent)
            if parent in OURS:
                todo.extend(_imports(OURS[parent]))
    return seen


SINGLE_PROCESS = [
    *sorted(n for n in OURS if n.startswith("model") and not n.startswith("model.distributed")),
    "model.distributed.config",
    "pipeline.config",
    "pipeline.stages.score",
    "pipeline.stages.features",
]


@pytest.mark.parametrize("module", SINGLE_PROCESS)
def test_single_process_modules_do_not_import_torchrec_distributed(module: str) -> None:
    reached = _closure(module)
    assert not {n for n in reached if n.startswith(FORBIDDEN)}, module
    heavy = {n for n in reached if n in OURS and n.startswith("model.distributed")}
    heavy -= LIGHT_DISTRIBUTED
    assert not heavy, f"{module} reaches {sorted(heavy)}"


def test_the_scan_sees_the_distributed_modules_import_it() -> None:
    assert any(n.startswith(FORBIDDEN) for n in _closure("model.distributed.runtime"))
    assert any(n.startswith(FORBIDDEN) for n in _closure("pipeline.distributed"))


def test_distributed_package_exports_resolve_lazily() -> None:
    for name in model.distributed.__all__:
        assert getattr(model.distributed, name) is not None, name
    with pytest.raises(AttributeError):
        _ = model.distributed.no_such_name
