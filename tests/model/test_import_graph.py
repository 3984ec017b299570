"""The single-process path never imports ``torchrec.distributed``: only model/distributed does.

Checked on our own import graph (an AST scan of module-level imports of model/ and pipeline/,
following our modules transitively), not on ``sys.modules``: ``import torchrec`` itself may pull in
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
LAZY_EXPORTS: dict[str, str] = {
    name: module for module, names in model.distributed.EXPORTS.items() for name in names
}


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
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue  # runs only when called: see the subprocess test below
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


#: The sharded serving strategy: imported by the model factory only for a multi-rank job.
SHARDED = {"model.serving.sharded"}
SINGLE_PROCESS = [
    *sorted(
        n
        for n in OURS
        if n.startswith("model") and not n.startswith("model.distributed") and n not in SHARDED
    ),
    "model.distributed.config",
    "pipeline.settings.loading",
    "pipeline.runtime.loop",
    "pipeline.serve",
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
    assert any(n.startswith(FORBIDDEN) for n in _closure("model.serving.sharded"))


def test_distributed_package_exports_resolve_lazily() -> None:
    for name in model.distributed.__all__:
        assert getattr(model.distributed, name) is not None, name
    with pytest.raises(AttributeError):
        _ = model.distributed.no_such_name


def test_a_single_process_scorer_never_loads_the_sharded_strategy(tmp_path: Path) -> None:
    """Function-level imports too: building a one-process scorer leaves our distributed modules
    unimported (the factory imports the sharded strategy only for several ranks)."""
    import subprocess
    import sys

    code = f"""
import sys
from pathlib import Path
from model.store.checkpoint import save_checkpoint
from model.ranker import build_ranker
from model.serving import ScorerFactory, ServingOptions
from tests.pipeline.factories import TINY_SPEC
path = Path({str(tmp_path / "m")!r})
save_checkpoint(build_ranker(TINY_SPEC, seed=0), TINY_SPEC, path)
ScorerFactory(ServingOptions(path, device="cpu", max_batch_rows=8)).create_scorer()
prefixes = ("model.serving.sharded", "model.distributed.")
print(sorted(m for m in sys.modules if m.startswith(prefixes)))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().splitlines()[-1] in ("[]", "['model.distributed.config']")
