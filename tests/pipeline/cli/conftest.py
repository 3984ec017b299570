"""``streamrank`` as a user runs it: a subprocess in a clean environment and directory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]

CliRunner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_cli(tmp_path: Path) -> CliRunner:
    """``run_cli("plan", "--json", env={...})``: ``python -m pipeline.cli`` in ``tmp_path``.

    No ``STREAMRANK_*`` variable of the caller's shell leaks in, and no ``streamrank.toml`` is
    picked up from the repository; ``env`` adds variables.
    """

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}
        python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), clean.get("PYTHONPATH")]))
        return subprocess.run(
            [sys.executable, "-m", "pipeline.cli", *args],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env={**clean, "PYTHONPATH": python_path, **(env or {})},
            check=False,
        )

    return run
