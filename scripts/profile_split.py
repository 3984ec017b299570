#!/usr/bin/env python3
"""Where the loop's wall time goes, per batch: a py-spy profile of ``streamrank run`` split by step.

Reads a ``py-spy record --format raw --idle --threads [--native]`` profile (collapsed stacks,
one ``frame;frame;... count`` per line), keeps the samples of the loop's thread (``MainThread``)
taken inside ``ScoringPipeline._loop`` and charges each to the first step of
:data:`CATEGORIES` whose frames it holds (a sample inside the forward is split further by its
innermost frame: matrix and embedding kernels, OpenMP's own code, or the rest of the call).
With ``--idle`` a sample is wall time (waiting on a socket or for a core counts); with
``--native`` the forward's native frames are visible (without it the forward is one step).
``--summary`` (``streamrank run --summary-json``) turns shares into milliseconds per batch: the
run's ``busy_seconds`` (first input to last output) over its batches, spread over the steps
other than waiting for input (a drain's loop waits for input while it joins the group and once
the backlog is gone, outside ``busy_seconds``).

Usage (one backlog drained in batches of about 5 events; BENCHMARKS.md, section 12)::

    streamrank produce --events 4000
    STREAMRANK_BATCHING__MAX_BATCH_ROWS=300 py-spy record --native --idle --threads --rate 250 \\
        --format raw -o prof.txt -- streamrank run --exit-when-idle 2 --summary-json run.json
    python scripts/profile_split.py prof.txt --summary run.json [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

LOOP = "ScoringPipeline._loop"
WAITING = "consume (poll, waits for input)"

CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("forward", ("Scorer.forward",)),
    ("top-K", ("Scorer.top_k",)),
    ("enrich: Redis round trip", ("AbstractConnection.send_packed_command",
                                  "AbstractConnection.read_response")),
    ("enrich: cache and decode", ("FeatureEnricher.enrich", "ConfiguredEnricher.enrich")),
    ("features and KJT", ("BatchSteps.prepare",)),
    ("encode", ("RecommendationSink.encode_batch",)),
    ("produce", ("RecommendationSink.send", "DeadLetterSink.publish")),
    ("commit", ("Checkpointer.", "TransactionalCheckpointer.")),
    (WAITING, ("KafkaSource.poll",)),
    ("decode and batch", ("ScoringPipeline._fill_batch",)),
    ("decide (policy, step)", ("ScoringPipeline._local_step", "ScoringPipeline._poll_wait_s",
                               "StepAgreement.agree")),
    ("bookkeeping (costs, budget, metrics)", ("BatchPolicy.", "BatchProcessor.take_costs",
                                               "Metrics.", "RunSummary.")),
)  # fmt: skip
"""Steps in the order they are matched (a sample goes to the first whose frame it holds)."""

PYTHON_FRAME = re.compile(r"\.py:\d+\)$")
"""A Python frame as py-spy writes it: ``name (path.py:line)``."""
KERNEL = re.compile(r"mkl_|gemm|fbgemm|dnnl|avx|kernel|function_ref|at::native::", re.I)
"""Innermost native frames doing the forward's arithmetic: matrix products, embedding bags,
copies (``function_ref``: the body of a parallel loop, its kernel inlined)."""
OPENMP = re.compile(r"GOMP_|gomp_|omp_|sched_yield|futex|^0x", re.I)
"""Innermost frames of OpenMP's own code (libgomp's team start and barriers; unresolved addresses
inside the forward are libgomp's, whose symbols are not exported) and of waiting for a core."""


def _names(stack: str) -> list[str]:
    return [frame.split(" (")[0] for frame in stack.split(";")]


def _category(names: list[str], leaf: str) -> str:
    """The step of a sample (its frames' names from the loop down; ``leaf``: its innermost frame
    as written)."""
    for name, marks in CATEGORIES:
        if any(frame.startswith(mark) for frame in names for mark in marks):
            if name != "forward":
                return name
            if PYTHON_FRAME.search(leaf):
                return "forward: Python (torch modules, TorchRec's KJT)"
            if KERNEL.search(leaf):
                return "forward: matrix, embedding and copy kernels"
            if OPENMP.search(leaf):
                return "forward: OpenMP (team start, barrier waits)"
            return "forward: native dispatch and allocation"
    return "loop (the rest)"


def split(lines: list[str]) -> tuple[Counter[str], int]:
    """Samples of the loop's thread inside the loop, by step.

    Returns:
        ``(samples by step, samples in all)``.
    """
    counts: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or "MainThread" not in stack.split(";", 1)[0]:
            continue
        names = _names(stack)
        if LOOP not in names:
            continue
        counts[_category(names[names.index(LOOP) :], stack.rsplit(";", 1)[-1])] += int(count)
    return counts, sum(counts.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("profile", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--summary", type=Path, help="streamrank run --summary-json file")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    counts, total = split(args.profile.read_text().splitlines())
    if not total:
        print(f"no samples of {LOOP} on MainThread in {args.profile}", file=sys.stderr)
        return 1
    per_batch_ms = None
    out: dict[str, object] = {"samples": total}
    if args.summary is not None:
        summary = json.loads(args.summary.read_text().strip().splitlines()[-1])
        batches = max(1, int(summary["batches"]))
        per_batch_ms = float(summary["busy_seconds"]) * 1000 / batches
        out |= {
            "batches": batches,
            "events_per_batch": round(summary["events_out"] / batches, 2),
            "wall_ms_per_batch": round(per_batch_ms, 2),
        }
    working = total - counts[WAITING]
    steps = {
        name: {
            "share": round(n / total, 3),
            **(
                {"ms_per_batch": round(n / working * per_batch_ms, 2)}
                if per_batch_ms and working and name != WAITING
                else {}
            ),
        }
        for name, n in counts.most_common()
    }
    out["steps"] = steps
    if args.json:
        print(json.dumps(out))
        return 0
    print(" ".join(f"{k} {v}" for k, v in out.items() if k != "steps"))
    for name, step in steps.items():
        ms = f"{step['ms_per_batch']:7.2f} ms" if "ms_per_batch" in step else ""
        print(f"{step['share']:6.1%} {ms}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
