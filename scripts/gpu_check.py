"""The one prepared GPU check: parity, forward speed by precision, and the host-fed scoring stage.

    python3 scripts/gpu_check.py [--device cuda:0] [--out gpu_check.json]
    python3 scripts/gpu_check.py --device cpu --small --sizes 256,512 --seconds 0.2   # in tests

Prints ONE JSON object:

- ``parity``: largest score difference against the CPU model (the same weights, the same
  batch) of the model on the device unsharded, through a 1-rank ``DistributedModelParallel``
  (NCCL on a GPU, gloo on a CPU), and with fp16/int8 tables (against the CPU model with the same
  quantized tables). Each must be <= 1e-5 (``ok``).
- ``forward``: rows/s of the bare forward at each ``--sizes`` rows per batch, in fp32, tf32
  and bf16, and bf16's largest score change against fp32.
- ``scoring_stage``: events/s and rows/s of the project's own scoring stage fed from Avro bytes
  built on the host: decode, enrichment from an in-process feature table (the synthetic world,
  standing in for Redis), features, the copy to the device, forward, top-K, encode, with the
  forward overlapped with preparing the next batch (:class:`ForwardExecutor`), plus the host
  seconds per stage. Needs fastavro and pydantic; where they are missing the entry says so.
- ``nccl_2_ranks``: with two or more GPUs, the same parity through a 2-rank NCCL DMP.

Runs offline in a few minutes on one GPU (torch 2.11 + TorchRec 1.6.1 there, 2.13 + 1.8.0
here). Exits 1 if a parity check fails, 2 if the device is not available.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.features import build_model_input
from model.inference import score_probabilities
from model.model_input import ModelInput
from model.options import Precision
from model.ranker import Ranker, build_ranker
from model.spec import FeatureSpec, SparseFeature, TableSpec
from model.synthetic import SampledEvents, SyntheticWorld, WorldConfig, feature_columns

TOLERANCE = 1e-5
SMALL_SPEC = FeatureSpec(
    tables=tuple(
        TableSpec(f, n) for f, n in zip(SparseFeature, (4000, 8000, 101, 16, 32, 8000), strict=True)
    ),
    embedding_dim=16,
    dense_arch=(32, 16),
    over_arch=(32, 1),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _world(spec: FeatureSpec) -> SyntheticWorld:
    return SyntheticWorld(
        WorldConfig(seed=3, user_dense_dim=spec.user_dense_dim, item_dense_dim=spec.item_dense_dim)
    )


def _events(world: SyntheticWorld, rows: int, seed: int = 0) -> SampledEvents:
    mean = (world.config.min_candidates + world.config.max_candidates) / 2
    return world.sample_events(max(1, int(rows / mean)), np.random.default_rng(seed))


def _batch(world: SyntheticWorld, spec: FeatureSpec, rows: int) -> ModelInput:
    return build_model_input(feature_columns(_events(world, rows), world, spec), spec)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float().cpu() - b.float().cpu()).abs().max())


def _init_group(backend: str, rank: int, world_size: int, port: int) -> None:
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )


def _dmp_scores(ranker: Ranker, spec: FeatureSpec, inp: ModelInput, device: torch.device) -> Any:
    from model.distributed import plan_sharding, shard_ranker

    world_size = dist.get_world_size()
    dmp = shard_ranker(ranker, plan_sharding(spec, world_size, device.type), device)
    return score_probabilities(dmp, inp.to(device))


def parity(ranker: Ranker, spec: FeatureSpec, inp: ModelInput, device: torch.device) -> dict:
    """Scores on ``device`` (unsharded, 1-rank DMP, quantized tables) against the CPU."""
    from model.quantize import quantize_ranker

    expected = ranker.score(inp)
    on_device = build_ranker(spec, device=device)
    on_device.load_state_dict(ranker.state_dict())
    out: dict[str, float] = {
        "unsharded": _diff(score_probabilities(on_device, inp.to(device)), expected)
    }
    _init_group("nccl" if device.type == "cuda" else "gloo", 0, 1, _free_port())
    try:
        out["dmp_1_rank"] = _diff(_dmp_scores(ranker, spec, inp, device), expected)
    finally:
        dist.destroy_process_group()
    for dtype in ("fp16", "int8"):
        cpu_quantized = quantize_ranker(ranker, dtype)
        device_quantized = quantize_ranker(on_device, dtype)
        out[f"{dtype}_tables"] = _diff(
            score_probabilities(device_quantized, inp.to(device)),
            score_probabilities(cpu_quantized, inp),
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
    """Bare forward rows/s per batch size and precision."""
    on_device = build_ranker(spec, device=device).eval()
    on_device.load_state_dict(ranker.state_dict())
    out: dict[str, Any] = {}
    for rows in sizes:
        inp = _batch(world, spec, rows).to(device)
        fp32 = score_probabilities(on_device, inp)
        entry: dict[str, Any] = {"rows": inp.num_rows}
        for precision in Precision:
            probs = score_probabilities(on_device, inp, precision=precision)
            _sync(device)
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds or calls < 3:
                score_probabilities(on_device, inp, precision=precision)
                calls += 1
            _sync(device)
            elapsed = time.perf_counter() - start
            entry[f"{precision.value}_rows_per_s"] = round(calls * inp.num_rows / elapsed)
            if precision is not Precision.FP32:
                entry[f"{precision.value}_max_abs_diff_vs_fp32"] = _diff(probs, fp32)
        out[str(rows)] = entry
    return out


class FeatureTable:
    """The synthetic world's user and item features in process memory (Redis stand-in)."""

    def __init__(self, world: SyntheticWorld) -> None:
        self._world = world

    def enrich(self, user_ids: np.ndarray, item_ids: np.ndarray) -> Any:
        from pipeline.stages.enrich import Enrichment

        world = self._world
        users, items = world.user_index_of(user_ids), world.item_index_of(item_ids)
        return Enrichment(
            user_dense=world.user_dense[users],
            user_recent=[world.stored_recent_item_ids(int(u)) for u in users],
            user_missing=np.zeros(len(users), bool),
            item_category=world.item_category[items],
            item_dense=world.item_dense[items],
            item_missing=np.zeros(len(items), bool),
        )


def scoring_stage(
    ranker: Ranker,
    world: SyntheticWorld,
    spec: FeatureSpec,
    device: torch.device,
    rows: int,
    batches: int,
) -> dict:
    """The pipeline's stages from Avro bytes to encoded Recommendations, overlapped."""
    try:
        from model.synthetic import to_event_dicts
        from pipeline.config import CodecSettings
        from pipeline.metrics import Metrics
        from pipeline.stages.columnar import ColumnarDecoder
        from pipeline.stages.commit import Checkpoint
        from pipeline.stages.decode import (
            RECOMMENDATION_SCHEMA_FILE,
            USER_EVENT_SCHEMA_FILE,
            RecordCodec,
        )
        from pipeline.stages.features import build_feature_columns, fallback_flags
        from pipeline.stages.publish import RecommendationSink
        from pipeline.stages.score import ForwardExecutor, PreparedBatch, ScoredBatch, Scorer
    except ImportError as exc:  # the GPU machine lacks a serving dependency
        return {"skipped": f"missing {exc.name}"}

    encoder = RecordCodec(CodecSettings(), USER_EVENT_SCHEMA_FILE, "in")
    payloads = [
        [encoder.encode(e) for e in to_event_dicts(_events(world, rows, seed=b), world)]
        for b in range(batches)
    ]
    decoder = ColumnarDecoder(CodecSettings(), recent_cap=spec.recent_items_cap)
    out_codec = RecordCodec(CodecSettings(), RECOMMENDATION_SCHEMA_FILE, "out")
    # The pipeline's own columnar encoder; nothing is produced (no producer).
    sink = RecommendationSink(None, "out", out_codec, Metrics())  # type: ignore[arg-type]
    table = FeatureTable(world)
    on_device = build_ranker(spec, device=device)
    on_device.load_state_dict(ranker.state_dict())
    scorer = Scorer(on_device, spec, "gpu-check", device)
    stage_s = dict.fromkeys(
        ("decode", "enrich", "features", "stage", "forward_top_k", "encode"), 0.0
    )
    encoded = 0

    def publish(batch: PreparedBatch, scored: ScoredBatch) -> None:
        nonlocal encoded
        start = time.perf_counter()
        flags = fallback_flags(batch.events, batch.enrichment)
        encoded += len(sink.encode(batch.events, scored, flags, "gpu-check", 0))
        stage_s["encode"] += time.perf_counter() - start

    executor = ForwardExecutor(scorer, Metrics(), publish, overlap=True, collective=False)
    # Untimed warm-up: the columnar kernels compile on first use (cached after).
    warm = decoder.decode(payloads[0][:1]).columns
    warm_enrichment = table.enrich(warm.user_ids, warm.candidate_ids)
    executor.submit(
        PreparedBatch(
            warm,
            warm_enrichment,
            Checkpoint(),
            scorer.stage(build_feature_columns(warm, warm_enrichment, spec)),
        )
    )
    executor.finish()
    stage_s = dict.fromkeys(stage_s, 0.0)
    encoded = 0
    scored_rows = 0
    start_all = time.perf_counter()
    for values in payloads:
        t0 = time.perf_counter()
        events = decoder.decode(values).columns
        t1 = time.perf_counter()
        enrichment = table.enrich(events.user_ids, events.candidate_ids)
        t2 = time.perf_counter()
        features = build_feature_columns(events, enrichment, spec)
        t3 = time.perf_counter()
        staged = scorer.stage(features)
        t4 = time.perf_counter()
        executor.submit(PreparedBatch(events, enrichment, Checkpoint(), staged))
        for name, seconds in zip(
            ("decode", "enrich", "features", "stage"),
            (t1 - t0, t2 - t1, t3 - t2, t4 - t3),
            strict=True,
        ):
            stage_s[name] += seconds
        scored_rows += events.num_rows
    executor.finish()
    executor.shutdown()
    elapsed = time.perf_counter() - start_all
    stage_s["forward_top_k"] = elapsed - sum(stage_s.values())  # the rest: waiting on the device
    events_total = sum(len(v) for v in payloads)
    return {
        "batches": batches,
        "rows_per_batch": round(scored_rows / batches),
        "events_per_s": round(events_total / elapsed),
        "rows_per_s": round(scored_rows / elapsed),
        "recommendations_encoded": encoded,
        "host_seconds_per_stage": {k: round(v, 4) for k, v in stage_s.items()},
    }


def _nccl_rank(rank: int, port: int, rows: int, small: bool, queue: Any) -> None:
    spec = SMALL_SPEC if small else FeatureSpec()
    _init_group("nccl", rank, 2, port)
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    ranker = build_ranker(spec, seed=0)
    inp = _batch(_world(spec), spec, rows)
    got = _dmp_scores(ranker, spec, inp, device)
    queue.put({"rank": rank, "max_abs_diff": _diff(got, ranker.score(inp))})
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--sizes", default="4096,65536,262144", help="rows per forward batch")
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per size/precision")
    parser.add_argument("--stage-rows", type=int, default=16384, help="rows per pipeline batch")
    parser.add_argument("--stage-batches", type=int, default=30)
    parser.add_argument("--small", action="store_true", help="a small model (for CPU tests)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"device": args.device, "error": "CUDA is not available"}))
        return 2
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    import fbgemm_gpu
    import torchrec

    spec = SMALL_SPEC if args.small else FeatureSpec()
    sizes = [int(s) for s in args.sizes.split(",")]
    ranker = build_ranker(spec, seed=0).eval()
    world = _world(spec)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {
            "torch": torch.__version__,
            "torchrec": torchrec.__version__,
            "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", "?"),
        },
        "parity": parity(ranker, spec, _batch(world, spec, min(sizes)), device),
        "forward": forward_speed(ranker, world, spec, device, sizes, args.seconds),
        "scoring_stage": scoring_stage(
            ranker, world, spec, device, args.stage_rows, args.stage_batches
        ),
    }
    if device.type == "cuda" and torch.cuda.device_count() >= 2:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        port = _free_port()
        procs = [
            ctx.Process(target=_nccl_rank, args=(r, port, min(sizes), args.small, queue))
            for r in range(2)
        ]
        for p in procs:
            p.start()
        ranks = sorted((queue.get(timeout=600) for _ in procs), key=lambda d: d["rank"])
        for p in procs:
            p.join(60)
        result["nccl_2_ranks"] = {
            "ranks": ranks,
            "ok": all(r["max_abs_diff"] <= TOLERANCE for r in ranks),
        }
    text = json.dumps(result)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    checks = [result["parity"]["ok"], result.get("nccl_2_ranks", {"ok": True})["ok"]]
    return 0 if all(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
