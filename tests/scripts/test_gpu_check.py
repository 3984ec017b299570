"""scripts/gpu_check.py runs end to end with ``--device cpu``, so the GPU check cannot rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.mark.slow
def test_gpu_check_on_the_cpu_prints_one_json_object_with_every_section(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--small",
            "--sizes",
            "256,512",
            "--seconds",
            "0.1",
            "--stage-rows",
            "512",
            "--stage-batches",
            "3",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == json.loads(out.read_text())
    assert report["parity"]["ok"]
    assert set(report["parity"]["max_abs_diff"]) == {
        "unsharded",
        "dmp_1_rank",
        "fp16_tables",
        "int8_tables",
    }
    for size in ("256", "512"):
        entry = report["forward"][size]
        assert all(entry[f"{p}_rows_per_s"] > 0 for p in ("fp32", "tf32", "bf16"))
        assert entry["tf32_max_abs_diff_vs_fp32"] == 0.0  # no TF32 on a CPU
    stage = report["scoring_stage"]
    assert stage["batches"] == 3 and stage["rows_per_s"] > 0
    assert stage["recommendations_encoded"] > 0
    assert set(stage["host_seconds_per_stage"]) == {
        "decode",
        "enrich",
        "features",
        "stage",
        "forward_top_k",
        "encode",
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_an_absent_gpu_is_reported_not_crashed(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda:0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert json.loads(result.stdout.strip().splitlines()[-1])["error"] == "CUDA is not available"
