"""Memory per rank of a sharded ranker with a big user table (gloo ranks on this host).

    python scripts/rank_memory.py --user-rows 10000000 --ranks 2 --dir /tmp/big [--keep]

Writes an untrained single-process checkpoint of the default spec with ``--user-rows`` user
rows (what ``init-model --events 0`` would save; skipped if ``--dir`` already holds one), then
starts ``--ranks`` gloo ranks that each plan (default ``balance = "split"``), build the ranker
on the meta device with only their own shards allocated, load the checkpoint (mapped, each rank
copies its slices) and score one small batch. Prints one JSON line per rank: planned bytes,
RSS after sharding, after loading, peak RSS (``ru_maxrss``), and anonymous / file-backed RSS.
"""

import argparse
import json
import os
import resource
import socket
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp


def _rss() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def _rank(rank: int, world_size: int, port: int, path: str) -> None:
    from model.distributed import (
        describe_plan,
        join_process_group,
        load_sharded,
        plan_sharding,
        shard_ranker,
    )
    from model.store.checkpoint import load_spec

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    device = join_process_group(rank, world_size, local_rank=rank, backend="gloo", timeout_s=600)
    spec = load_spec(path)
    plan = plan_sharding(spec, world_size)
    planned = describe_plan(plan, spec, world_size).ranks[rank].bytes
    dmp = shard_ranker(spec, plan, device)
    sharded = _rss()
    load_sharded(dmp, path)
    loaded = _rss()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {
        "rank": rank,
        "world_size": world_size,
        "planned_bytes": planned,
        "rss_after_shard": sharded["VmRSS"],
        "rss_after_load": loaded["VmRSS"],
        "rss_anon_after_load": loaded["RssAnon"],
        "rss_file_after_load": loaded["RssFile"],
        "peak_rss": peak,
    }
    print(json.dumps(result), flush=True)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--user-rows", type=int, default=10_000_000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--dir", type=Path, required=True)
    args = parser.parse_args()
    from model.features.spec import FeatureSpec
    from model.ranker import build_ranker
    from model.store.checkpoint import save_checkpoint

    if not (args.dir / "meta.json").exists():
        spec = FeatureSpec.from_settings({"num_embeddings": {"user_id": args.user_rows}})
        start = time.monotonic()
        save_checkpoint(build_ranker(spec, seed=0).eval(), spec, args.dir)
        print(f"wrote {args.dir} in {time.monotonic() - start:.0f} s", flush=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.start_processes(
        _rank, args=(args.ranks, port, str(args.dir)), nprocs=args.ranks, start_method="spawn"
    )


if __name__ == "__main__":
    main()
