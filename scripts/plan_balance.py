"""Markdown table of ``streamrank plan --json`` balance for a range of world sizes.

    python scripts/plan_balance.py [MIN_RANKS] [MAX_RANKS]   # default 1 8

Runs ``python -m pipeline.cli plan --nproc N --json`` for each N (the configuration of the
environment applies, e.g. ``STREAMRANK_MODEL__NUM_EMBEDDINGS='{"user_id": 10000000}'``) and prints
one row per N: the busiest rank's bytes and work (bytes read per scored row), their ratios to the
ideal, and the tables split over several ranks.
"""

import json
import subprocess
import sys


def row(world_size: int) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "plan", "--nproc", str(world_size), "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    plan = json.loads(out.strip().splitlines()[-1])
    bal = plan["balance"]
    split = [t for t in plan["tables"] if len(t["ranks"]) > 1]
    names = ", ".join(f"{t['feature']} ({t['sharding_type']})" for t in split) or "-"
    return (
        f"| {world_size} | {bal['max_bytes'] / 2**20:.1f} MiB | {bal['bytes_ratio']:.3f} "
        f"| {bal['max_work']:.0f} B | {bal['work_ratio']:.3f} | {names} |"
    )


def main() -> None:
    args = [int(a) for a in sys.argv[1:3]]
    low, high = (args + [1, 8][len(args) :])[:2]
    print("| ranks | busiest rank bytes | / ideal | busiest rank work per row | / ideal | split |")
    print("|---|---|---|---|---|---|")
    for world_size in range(low, high + 1):
        print(row(world_size))


if __name__ == "__main__":
    main()
