"""scripts/latency_check.py: the p99 of each window of the run, by when its events were sent."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "latency_check.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("latency_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_slow_start_shows_in_its_own_window_and_an_empty_window_is_skipped() -> None:
    windows = _script().windows
    # 100 events a second for 30 s, the first second's 10x slower; nothing sent in 10-20 s
    sent = np.arange(0, 30_000, 10, dtype=np.float64)
    latency = np.where(sent < 1000, 500.0, 50.0)
    keep = (sent < 10_000) | (sent >= 20_000)
    result = windows(sent[keep] + 1_700_000_000_000, latency[keep], 10.0)
    assert result == [500.0, 50.0]
    assert windows(np.array([]), np.array([]), 10.0) == []


def test_a_bad_option_is_one_line_and_exit_status_2() -> None:
    for args, why in ((["--window-s", "0"], "--window-s"), (["--load", "2"], "--load")):
        out = subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 2
        assert out.stderr.strip().splitlines() == [out.stderr.strip()]
        assert why in out.stderr and "Traceback" not in out.stderr
