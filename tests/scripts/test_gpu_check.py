"""scripts/gpu_check.py runs end to end with ``--device cpu``, so the GPU check cannot rot, and
what a lend of minutes gets out of it survives a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
SMALL = ["--device", "cpu", "--small", "--sizes", "256,512", "--seconds", "0.1"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}


def _lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_gpu_check_on_the_cpu_prints_json_after_every_section(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *SMALL,
            "--transfer-sizes",
            "256,64,1024,64",
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
        env=_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = _lines(result.stdout)
    report = lines[-1]
    assert report == json.loads(out.read_text())
    sections = [
        "parity", "worker_transfer", "forward", "scoring_stage", "nccl_2_ranks", "configured",
    ]  # fmt: skip
    assert [line["section"] for line in lines[:-1]] == sections
    for line in lines[:-1]:
        assert report[line["section"]] == line["result"]
    check = report["check"]
    assert check["finished"] and check["running"] is None and check["failed"] == []
    assert check["done"] == sections and set(check["seconds"]) == set(sections)
    assert report["ok"]

    assert report["parity"]["ok"]
    assert set(report["parity"]["max_abs_diff"]) == {
        "unsharded",
        "dmp_1_rank",
        "fp16_tables",
        "int8_tables",
    }
    transfer = report["worker_transfer"]
    assert transfer["ok"] and transfer["synchronizations"] is None  # nothing to count on a CPU
    rows = [b["rows"] for b in transfer["batches"]]
    assert len(rows) == 4 and max(rows) > 4 * min(rows)  # several sizes, up and down
    assert all(b["top_k_equal"] and b["max_abs_diff"] == 0.0 for b in transfer["batches"])
    for size in ("256", "512"):
        entry = report["forward"][size]
        assert all(entry[f"{p}_rows_per_s"] > 0 for p in ("fp32", "tf32", "bf16"))
        assert entry["tf32_max_abs_diff_vs_fp32"] == 0.0  # no TF32 on a CPU
    stage = report["scoring_stage"]
    assert stage["batches"] == 3 and stage["rows_per_s"] > 0
    assert stage["recommendations_produced"] > 0
    assert set(stage["seconds_per_stage"]) == {"decode", "enrich", "features", "forward", "produce"}
    assert all(seconds > 0 for seconds in stage["seconds_per_stage"].values())
    if not torch.cuda.is_available():
        assert report["nccl_2_ranks"] == {"skipped": "needs 2 GPUs, this machine has 0"}
    assert report["configured"] == {"skipped": "no --config naming a [model.module]"}


@pytest.mark.slow
@pytest.mark.parametrize("example", ["deepfm", "dcn", "weighted", "sequence"])
def test_gpu_check_checks_an_example_model_of_the_users(tmp_path: Path, example: str) -> None:
    root = SCRIPT.parents[1]
    config = tmp_path / "config.toml"
    text = (root / "examples" / example / "streamrank.toml").read_text()
    text = text.replace('code_dir = "examples/', f'code_dir = "{root}/examples/')
    config.write_text(text.replace('schema_file = "examples/', f'schema_file = "{root}/examples/'))
    out = tmp_path / "check.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), *SMALL, "--sections", "configured", "--config",
         str(config), "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=_env(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    section = json.loads(out.read_text())["configured"]
    assert section["ok"] and section["factory"].startswith(("torchrec.models.", "history_ranker"))
    assert set(section["max_abs_diff"]) == {"unsharded", "dmp_1_rank", "fp16_tables", "int8_tables"}


@pytest.mark.slow
def test_a_run_killed_midway_keeps_every_finished_section(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    # forward would time 3 precisions x 2 sizes x 60 s: the kill comes long before its end.
    args = [*SMALL, "--seconds", "60", "--sections", "parity,forward", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env=_env(),
    )
    try:
        assert proc.stdout is not None
        first = None
        for line in proc.stdout:
            if line.startswith('{"section"'):
                first = json.loads(line)
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert first is not None and first["section"] == "parity"
    saved = json.loads(out.read_text())
    assert saved["parity"] == first["result"] and saved["parity"]["ok"]
    check = saved["check"]
    assert check["done"] == ["parity"] and not check["finished"]
    # "forward" once it has started (the kill may come between the line and that write)
    assert check["running"] in (None, "forward")
    assert "ok" not in saved and "forward" not in saved
    # A kill during a write leaves at most that write's temporary file; check.json stays whole.
    others = {p.name for p in tmp_path.iterdir()} - {"check.json"}
    assert others <= {f".check.json.tmp-{proc.pid}"}


def test_unknown_sections_are_refused_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--sections", "parity,nope"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=_env(),
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    # The last line: torch 2.11's FBGEMM may warn about its version table on import before it.
    assert result.stderr.strip().splitlines()[-1] == (
        "gpu_check: unknown sections ['nope']; one of "
        "['parity', 'worker_transfer', 'forward', 'scoring_stage', 'nccl_2_ranks', 'configured']"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_an_absent_gpu_is_reported_not_crashed(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cuda:0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=_env(),
    )
    assert result.returncode == 2
    report = _lines(result.stdout)[-1]
    assert report["error"] == "CUDA is not available" and report["ok"] is False
    assert json.loads((tmp_path / "gpu_check.json").read_text()) == report
