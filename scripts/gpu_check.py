"""The one prepared GPU check: parity, the serving copy path, forward speed, the scoring stage.

    python3 scripts/gpu_check.py [--device cuda:0] [--out gpu_check.json] [--sections a,b]
    python3 scripts/gpu_check.py --device cpu --small --sizes 256,512 --seconds 0.2   # in tests

Sections, in this order (each one guarded: an exception is recorded in its entry and the next
section runs):

- ``parity``: largest score difference against the CPU model (same weights, same batch) of the
  model on the device unsharded, through a 1-rank ``DistributedModelParallel`` (NCCL on a GPU,
  gloo on a CPU), and with fp16/int8 tables. Each must be <= 1e-5 (``ok``).
- ``worker_transfer``: batches of several sizes staged through
  ``model.serving.transfer.DeviceTransfer``
  while a scoring thread runs forward and top-K, against a plain ``.to()``; synchronisations
  counted on a GPU (only torch and ``model.*`` imported).
- ``forward``: rows/s of the bare forward at each ``--sizes``, in fp32, tf32 and bf16, and
  each precision's largest score change against fp32.
- ``scoring_stage``: events/s and rows/s of the pipeline's own stages from Avro bytes (needs
  the pipeline's dependencies; ``skipped`` where one is missing).
- ``nccl_2_ranks``: with two or more GPUs, the parity through a 2-rank NCCL DMP (child
  processes, polled: a crashed rank ends the section at once).
- ``configured``: with ``--config`` naming a ``[model.module]`` (e.g.
  ``examples/deepfm/streamrank.toml``), the parity of that model of the user's
  (:mod:`scripts.gpucheck.configured`); ``skipped`` without.

Output (:mod:`scripts.gpucheck.report`): after every section the whole JSON object is rewritten
to ``--out`` (atomically) and one line ``{"section", "seconds", "result"}`` is printed; at the
end the whole object is printed as the last line. A run killed midway leaves every finished
section in ``--out`` and ``check.running`` naming the one it died in.

Runs offline in a few minutes on one GPU (torch 2.11 + TorchRec 1.6.1 there, 2.13 + 1.8.0
here). Exits 1 if a check fails or a section raises, 2 if the device is not available.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.ranker import build_ranker
from model.serving.device import bind_thread
from scripts.gpucheck.common import batch, check_spec, synthetic_world
from scripts.gpucheck.configured import configured_parity
from scripts.gpucheck.model_sections import forward_speed, parity
from scripts.gpucheck.nccl import nccl_2_ranks
from scripts.gpucheck.report import CheckReport
from scripts.gpucheck.scoring_stage import scoring_stage
from scripts.gpucheck.worker_transfer import worker_transfer

SECTIONS = (
    "parity",
    "worker_transfer",
    "forward",
    "scoring_stage",
    "nccl_2_ranks",
    "configured",
)


def _ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--sizes", default="4096,65536,262144", help="rows per forward batch")
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per size/precision")
    parser.add_argument(
        "--transfer-sizes",
        default="4096,256,65536,1024,16384,16384,64",
        help="rows of the worker_transfer batches, in order",
    )
    parser.add_argument("--stage-rows", type=int, default=16384, help="rows per pipeline batch")
    parser.add_argument("--stage-batches", type=int, default=30)
    parser.add_argument("--nccl-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument("--small", action="store_true", help="a small model (for CPU tests)")
    parser.add_argument("--config", type=Path, default=None, help="a TOML with [model.module]")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="which, comma-separated")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    return parser


def main() -> int:
    args = _parser().parse_args()
    chosen = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        print(f"gpu_check: unknown sections {unknown}; one of {list(SECTIONS)}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        report = CheckReport(args.out, {"device": args.device, "error": "CUDA is not available"})
        report.finish(ok=False)
        return 2
    bind_thread(device)
    import fbgemm_gpu
    import torchrec

    spec = check_spec(args.small)
    sizes = _ints(args.sizes)
    ranker = build_ranker(spec, seed=0).eval()
    world = synthetic_world(spec)
    report = CheckReport(
        args.out,
        {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
            "versions": {
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "torchrec": torchrec.__version__,
                "fbgemm_gpu": getattr(fbgemm_gpu, "__version__", "?"),
            },
        },
    )
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "parity": lambda: parity(ranker, spec, batch(world, spec, min(sizes)), device),
        "worker_transfer": lambda: worker_transfer(
            ranker, world, spec, device, _ints(args.transfer_sizes)
        ),
        "forward": lambda: forward_speed(ranker, world, spec, device, sizes, args.seconds),
        "scoring_stage": lambda: scoring_stage(
            ranker, world, spec, device, args.stage_rows, args.stage_batches
        ),
        "nccl_2_ranks": lambda: nccl_2_ranks(min(sizes), args.small, args.nccl_timeout),
        "configured": lambda: configured_parity(args.config, device, min(sizes)),
    }
    verdicts = [report.section(name, runs[name]).get("ok", True) for name in chosen]
    ok = all(verdicts) and not report.failed
    report.finish(ok=ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
