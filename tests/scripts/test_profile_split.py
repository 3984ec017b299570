"""scripts/profile_split.py: a py-spy profile of the loop's thread, split by step per batch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "profile_split.py"

LOOP = (
    "thread (1): MainThread;<module> (pipeline/cli/__main__.py:5);ScoringPipeline._loop (loop.py:1)"
)
PROFILE = [
    # the forward: a kernel, OpenMP's barrier (unresolved libgomp address), Python
    f"{LOOP};Scorer.forward (s.py:1);Linear.forward (linear.py:134);mkl_blas_sgemm 30",
    f"{LOOP};Scorer.forward (s.py:1);Linear.forward (linear.py:134);GOMP_parallel;0x7ffb4fa1 50",
    f"{LOOP};Scorer.forward (s.py:1);DLRM.forward (dlrm.py:1) 10",
    # enrich: the Redis round trip, then the rest of enrich
    f"{LOOP};BatchSteps.prepare (steps.py:1);FeatureEnricher.enrich (e.py:1);"
    "AbstractConnection.read_response (c.py:1) 5",
    f"{LOOP};BatchSteps.prepare (steps.py:1);FeatureEnricher.enrich (e.py:1) 3",
    f"{LOOP};BatchSteps.prepare (steps.py:1);BuiltinFeatures.stage (f.py:1) 2",
    # waiting for input: not a step of a batch
    f"{LOOP};KafkaSource.poll (source.py:112) 100",
    # other threads and samples outside the loop are not the loop's
    "thread (2): forward_0;Scorer.forward (s.py:1) 500",
    "thread (1): MainThread;<module> (pipeline/cli/__main__.py:5);build_pipeline (serve.py:1) 500",
]


def test_the_loops_samples_are_split_by_step_and_waiting_is_not_a_batchs(tmp_path: Path) -> None:
    profile = tmp_path / "prof.txt"
    profile.write_text("\n".join(PROFILE) + "\n")
    summary = tmp_path / "run.json"
    summary.write_text(json.dumps({"batches": 10, "busy_seconds": 1.0, "events_out": 50}))
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(profile), "--summary", str(summary), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    assert (result["samples"], result["events_per_batch"], result["wall_ms_per_batch"]) == (
        200,
        5.0,
        100.0,
    )
    steps = result["steps"]
    assert steps["forward: OpenMP (team start, barrier waits)"] == {
        "share": 0.25,
        "ms_per_batch": 50.0,
    }
    assert steps["forward: matrix, embedding and copy kernels"]["ms_per_batch"] == 30.0
    assert steps["forward: Python (torch modules, TorchRec's KJT)"]["ms_per_batch"] == 10.0
    assert steps["enrich: Redis round trip"]["ms_per_batch"] == 5.0
    assert steps["enrich: cache and decode"]["ms_per_batch"] == 3.0
    assert steps["features and KJT"]["ms_per_batch"] == 2.0
    assert steps["consume (poll, waits for input)"] == {"share": 0.5}  # no ms: not a batch's


def test_a_profile_without_the_loop_says_so(tmp_path: Path) -> None:
    profile = tmp_path / "prof.txt"
    profile.write_text(PROFILE[-1] + "\n")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(profile)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 1 and "no samples" in out.stderr
