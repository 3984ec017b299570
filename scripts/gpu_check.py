"""One prepared GPU check (run it when a session is lent a GPU machine):

    .venv/bin/python scripts/gpu_check.py [--rows 4096] [--out gpu_check.json]

Scores the same batch of the default DLRM on the CPU and on ``cuda:0`` (the device the pipeline
picks with ``model.device = "auto"``), reports the max score difference and the forward time on
each, and, with two or more GPUs, does the same through a 2-rank NCCL DistributedModelParallel
spawned here. Prints one JSON object. Exits 2 when CUDA is not available.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.features import build_model_input
from model.ranker import build_ranker
from model.spec import FeatureSpec
from model.synthetic import SyntheticWorld, WorldConfig, feature_columns


def _timed(fn, repeats: int = 20) -> tuple[torch.Tensor, float]:  # type: ignore[no-untyped-def]
    out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out, (time.perf_counter() - start) / repeats * 1000


def _batch(spec: FeatureSpec, rows: int):  # type: ignore[no-untyped-def]
    world = SyntheticWorld(WorldConfig(seed=3))
    events = world.sample_events(max(1, rows // 40), np.random.default_rng(0))
    return build_model_input(feature_columns(events, world, spec), spec)


def _nccl_rank(rank: int, port: int, rows: int, queue: mp.Queue) -> None:  # type: ignore[type-arg]
    import torch.distributed as dist

    from model.distributed import plan_sharding, shard_ranker
    from model.inference import score_probabilities

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl", rank=rank, world_size=2)
    device = torch.device(f"cuda:{rank}")
    spec = FeatureSpec()
    ranker = build_ranker(spec, seed=0)
    inp = _batch(spec, rows)
    expected = ranker.score(inp)
    dmp = shard_ranker(ranker, plan_sharding(spec, 2, "cuda"), device)
    got, ms = _timed(lambda: score_probabilities(dmp, inp.to(device)))
    queue.put(
        {"rank": rank, "max_abs_diff": float((got.cpu() - expected).abs().max()), "forward_ms": ms}
    )
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"cuda": False, "error": "CUDA is not available on this machine"}))
        return 2
    spec = FeatureSpec()
    ranker = build_ranker(spec, seed=0).eval()
    inp = _batch(spec, args.rows)
    cpu_scores, cpu_ms = _timed(lambda: ranker.score(inp), repeats=5)
    gpu = ranker.to("cuda:0")
    gpu_inp = inp.to("cuda:0")
    gpu_scores, gpu_ms = _timed(lambda: gpu.score(gpu_inp))
    result: dict[str, object] = {
        "cuda": True,
        "device": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "rows": inp.num_rows,
        "cpu_forward_ms": round(cpu_ms, 3),
        "gpu_forward_ms": round(gpu_ms, 3),
        "max_abs_diff_gpu_vs_cpu": float((gpu_scores.cpu() - cpu_scores).abs().max()),
    }
    if torch.cuda.device_count() >= 2:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=_nccl_rank, args=(r, 29533, args.rows, queue)) for r in range(2)
        ]
        for p in procs:
            p.start()
        result["nccl_2_ranks"] = sorted(
            (queue.get(timeout=600) for _ in procs), key=lambda d: d["rank"]
        )
        for p in procs:
            p.join(60)
    text = json.dumps(result)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
