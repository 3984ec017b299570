"""``streamrank bench ...`` as a user runs it, for the bench tools' option checks."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def bench_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m pipeline.cli bench *args`` in the repository, no ``STREAMRANK_*`` variable
    of the caller's shell but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        env={**clean, **env},
        check=False,
    )


def assert_one_line_user_error(*args: str) -> None:
    """``bench *args`` exits 2 with a one-line message, no traceback."""
    done = bench_cli(*args, env={})
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
