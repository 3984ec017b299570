"""scripts/install.sh picks exactly one FBGEMM build: CUDA with a GPU (or when asked), else CPU.

Checked through ``--dry-run``, which prints the plan and installs nothing; ``auto`` is checked
with a stand-in ``nvidia-smi`` on PATH that lists a GPU, or fails like a machine without one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

INSTALL = Path(__file__).resolve().parents[2] / "scripts" / "install.sh"


def _dry_run(accel: str | None, path_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMRANK_ACCEL"}
    if accel is not None:
        env["STREAMRANK_ACCEL"] = accel
    if path_dir is not None:
        env["PATH"] = f"{path_dir}:{env['PATH']}"
    return subprocess.run(
        ["bash", str(INSTALL), "--dry-run"], env=env, capture_output=True, text=True, timeout=30
    )


def _fake_nvidia_smi(tmp_path: Path, works: bool) -> Path:
    tool = tmp_path / "nvidia-smi"
    body = 'echo "GPU 0: NVIDIA H200 (UUID: GPU-0)"' if works else "exit 9"
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)
    return tmp_path


def _plan(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    accel = lines[0].split()[1]
    (extras,) = [line for line in lines if line.startswith("pip install -e")]
    return accel, extras


@pytest.mark.parametrize(
    ("accel", "fbgemm", "removed"),
    [
        ("cpu", "fbgemm-gpu-cpu==1.8.0", "fbgemm-gpu"),
        ("cuda", "fbgemm-gpu==1.8.0", "fbgemm-gpu-cpu"),
    ],
)
def test_explicit_accelerator_selects_one_fbgemm(accel: str, fbgemm: str, removed: str) -> None:
    result = _dry_run(accel)
    got, extras = _plan(result)
    assert got == accel
    assert f".[dev,{accel}]" in extras and fbgemm in extras
    assert f"pip uninstall {removed} " in result.stdout


def test_auto_picks_cuda_when_nvidia_smi_lists_a_gpu(tmp_path: Path) -> None:
    assert _plan(_dry_run(None, _fake_nvidia_smi(tmp_path, works=True)))[0] == "cuda"


def test_auto_picks_cpu_when_nvidia_smi_fails(tmp_path: Path) -> None:
    assert _plan(_dry_run("auto", _fake_nvidia_smi(tmp_path, works=False)))[0] == "cpu"


def test_unknown_accelerator_is_a_one_line_error() -> None:
    result = _dry_run("tpu")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "install: STREAMRANK_ACCEL must be auto, cpu or cuda, not 'tpu'"
    ]
