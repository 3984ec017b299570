"""``parity`` (the device against the CPU) and ``forward`` (bare forward rows/s by precision)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from model.features.model_input import ModelInput
from model.features.spec import FeatureSpec
from model.options import Precision
from model.ranker import Ranker, build_ranker
from model.serving.inference import score_probabilities
from model.synthetic import SyntheticWorld
from scripts.gpucheck.common import TOLERANCE, batch, free_port, max_abs_diff, sync


def on_device(ranker: Ranker, spec: FeatureSpec, device: torch.device) -> Ranker:
    """A copy of ``ranker`` on ``device`` (eval mode)."""
    copy = build_ranker(spec, device=device).eval()
    copy.load_state_dict(ranker.state_dict())
    return copy


def dmp_scores(
    ranker: Ranker, spec: FeatureSpec, inp: ModelInput, device: torch.device
) -> torch.Tensor:
    """Scores of ``inp`` through a ``DistributedModelParallel`` of ``ranker`` over the current
    process group (one rank per GPU of this host)."""
    from model.distributed import plan_sharding, shard_ranker

    world = dist.get_world_size()
    plan = plan_sharding(spec, world, device.type, local_world_size=world)
    return score_probabilities(shard_ranker(ranker, plan, device), inp.to(device))


def parity(ranker: Ranker, spec: FeatureSpec, inp: ModelInput, device: torch.device) -> dict:
    """Scores on ``device`` (unsharded, 1-rank DMP, quantized tables) against the CPU.

    Returns:
        ``{"max_abs_diff": {"unsharded": ..., "dmp_1_rank": ..., "fp16_tables": ...,
        "int8_tables": ...}, "ok": every difference <= TOLERANCE}``.
    """
    from model.distributed import join_process_group
    from model.serving.quantize import quantize_ranker

    expected = ranker.score(inp)
    moved = on_device(ranker, spec, device)
    out: dict[str, float] = {
        "unsharded": max_abs_diff(score_probabilities(moved, inp.to(device)), expected)
    }
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    backend = "nccl" if device.type == "cuda" else "gloo"
    join_process_group(0, 1, local_rank=device.index or 0, backend=backend, timeout_s=120)
    try:
        out["dmp_1_rank"] = max_abs_diff(dmp_scores(ranker, spec, inp, device), expected)
    finally:
        dist.destroy_process_group()
    for dtype in ("fp16", "int8"):
        out[f"{dtype}_tables"] = max_abs_diff(
            score_probabilities(quantize_ranker(moved, dtype), inp.to(device)),
            score_probabilities(quantize_ranker(ranker, dtype), inp),
        )
    return {"max_abs_diff": out, "ok": all(v <= TOLERANCE for v in out.values())}


def forward_speed(
    ranker: Ranker,
    world: SyntheticWorld,
    spec: FeatureSpec,
    device: torch.device,
    sizes: list[int],
    seconds: float,
) -> dict:
    """Bare forward rows/s per batch size and precision, and each precision's largest score
    change against fp32.

    Returns:
        ``{"<rows>": {"rows": ..., "fp32_rows_per_s": ..., "tf32_rows_per_s": ...,
        "tf32_max_abs_diff_vs_fp32": ..., "bf16_rows_per_s": ..., ...}}``.
    """
    model = on_device(ranker, spec, device)
    out: dict[str, Any] = {}
    for rows in sizes:
        inp = batch(world, spec, rows).to(device)
        fp32 = score_probabilities(model, inp)
        entry: dict[str, Any] = {"rows": inp.num_rows}
        for precision in Precision:
            probs = score_probabilities(model, inp, precision=precision)
            sync(device)
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds or calls < 3:
                score_probabilities(model, inp, precision=precision)
                calls += 1
            sync(device)
            elapsed = time.perf_counter() - start
            entry[f"{precision.value}_rows_per_s"] = round(calls * inp.num_rows / elapsed)
            if precision is not Precision.FP32:
                entry[f"{precision.value}_max_abs_diff_vs_fp32"] = max_abs_diff(probs, fp32)
        out[str(rows)] = entry
    return out
