"""Tests for pipeline.cli.errors: which exceptions are user errors (one line, exit code 2), and
what a failure that is not one shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model.serving.device import rank_device
from pipeline.cli import app
from pipeline.cli.errors import USER_ERROR_EXIT_CODE, as_user_error

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_a_rank_started_for_a_missing_gpu_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # --nproc 3 on a host with 2 GPUs: the third rank stops with one line, not a traceback.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError) as raised:
        rank_device(2)
    user_error = as_user_error(raised.value)
    assert user_error is not None and user_error.exit_code == USER_ERROR_EXIT_CODE
    assert str(user_error) == str(raised.value)
    assert "at most 2 rank(s) per host" in str(user_error)


def test_other_failures_keep_their_traceback() -> None:
    assert as_user_error(ValueError("a bug")) is None
    assert as_user_error(RuntimeError("CUDA error: out of memory")) is None


_CRASHING_COMMAND = """
import sys
from pipeline.cli import app

@app.command("crash")
def crash() -> None:
    redis_url = "rediss://:not-for-tracebacks@127.0.0.1:6380/0"
    raise RuntimeError("an outage, not a user error: " + redis_url[:8])

app(["--log-format", "rich", "crash"])
"""


def test_a_traceback_shows_no_local_variables() -> None:
    """Set on the app, whatever typer's default: a local may hold a password."""
    assert app.pretty_exceptions_show_locals is False
    result = subprocess.run(
        [sys.executable, "-c", _CRASHING_COMMAND],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "RuntimeError: an outage, not a user error: rediss:/" in result.stderr  # rich
    assert "not-for-tracebacks" not in result.stderr + result.stdout
