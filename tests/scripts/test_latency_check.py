"""scripts/latency_check.py: the p99 of each window of the run, by when its events were sent."""

from __future__ import annotations

import importlib.util
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
