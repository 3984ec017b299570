"""``bench soak --trace``: what the pipeline process does with memory and the garbage collector,
recorded from inside it by a wrapper (the serving code knows nothing of it).

``python -m pipeline.tools.bench.soak.trace TRACE_FILE run ARGS...`` runs ``python -m
pipeline.cli run ARGS...`` in this process after installing:

- a ``gc.callbacks`` hook: every collection of generation 1 or 2, and any that took at least
  :data:`SLOW_GC_MS`, with its pause and the RSS after it;
- a sampler thread, every second: RSS (anonymous and file-backed), glibc's ``mallinfo2``
  (heap obtained by ``brk`` and the arenas, ``mmap``-ed chunks, bytes in use, bytes free inside
  the heap), Python's allocated blocks (pymalloc: Python objects) and the collector's counts.

One JSON object per line. :func:`summarise` turns the file into what the soak reports: the
pauses, and each step of anonymous RSS with what moved with it (a heap that grew while the bytes
in use did not is fragmentation or a high-water mark; bytes in use that grew are kept memory;
neither, pages of an existing mapping touched for the first time, e.g. a preallocated array).

Example::

    python -m pipeline.tools.bench.soak.trace artifacts/soak/trace.jsonl run --summary-json s.json
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import json
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["STEP_MIB", "summarise", "trace_and_run"]

SLOW_GC_MS = 10.0
"""A generation-0 collection is recorded when it took at least this long."""

STEP_MIB = 4
"""A one-second rise of anonymous RSS of at least this many MiB is a step."""

_MIB = 2**20


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo() -> dict[str, int]:
    """glibc's allocator in MiB (empty where glibc has no ``mallinfo2``)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return {}
    return {
        "heap_mib": info.arena // _MIB,
        "mmap_mib": info.hblkhd // _MIB,
        "in_use_mib": info.uordblks // _MIB,
        "free_mib": info.fordblks // _MIB,
    }


def _rss() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            out[key.lower() + "_mib"] = int(value.split()[0]) // 1024
    return out


class _Tracer:
    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._started: dict[int, float] = {}

    def write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._out.write(json.dumps({"t": round(time.monotonic(), 3), **record}) + "\n")

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        generation = info["generation"]
        if phase == "start":
            self._started[generation] = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - self._started.get(generation, time.perf_counter())) * 1e3
        if generation >= 1 or pause_ms >= SLOW_GC_MS:
            self.write(
                {
                    "gc": generation,
                    "pause_ms": round(pause_ms, 2),
                    "collected": info["collected"],
                    **_rss(),
                }
            )

    def sample_forever(self) -> None:
        while True:
            self.write(
                {
                    **_rss(),
                    **_mallinfo(),
                    "py_blocks": sys.getallocatedblocks(),
                    "gc_counts": list(gc.get_count()),
                }
            )
            time.sleep(1.0)


def trace_and_run(trace_file: Path, cli_args: list[str]) -> None:
    """Install the hooks, then run the ``streamrank`` command ``cli_args`` in this process."""
    out = trace_file.open("w", buffering=1)
    tracer = _Tracer(out)
    gc.callbacks.append(tracer.on_gc)
    threading.Thread(target=tracer.sample_forever, name="soak-trace", daemon=True).start()
    # ``python -m pipeline.cli ARGS``, in this process: the program, as the interpreter's -m
    # runs it (this module sits below the CLI and does not import it)
    sys.argv = ["streamrank", *cli_args]
    runpy.run_module("pipeline.cli", run_name="__main__", alter_sys=True)


def summarise(trace_file: Path, started_at: float, slow_gc_ms: float = 50.0) -> dict[str, Any]:
    """What a trace shows, times in seconds since ``started_at`` (monotonic: the soak's clock).

    Args:
        trace_file: the trace.
        started_at: ``time.monotonic()`` when the producer started.
        slow_gc_ms: collections at least this long are listed one by one.

    Returns:
        ``gc``: per generation the collections and the longest pause, ``slow_gc``: each slow
        one (``t_s``, generation, ``pause_ms``); ``rss_steps``: each one-second rise of
        anonymous RSS of :data:`STEP_MIB` or more, with the heap, ``mmap``, in-use and
        Python-block changes in that second; ``last``: the last sample.
    """
    records = [json.loads(line) for line in trace_file.read_text().splitlines() if line.strip()]
    gcs = [r for r in records if "gc" in r]
    samples = [r for r in records if "py_blocks" in r]
    per_generation: dict[str, dict[str, float]] = {}
    for r in gcs:
        entry = per_generation.setdefault(str(r["gc"]), {"collections": 0, "max_pause_ms": 0.0})
        entry["collections"] += 1
        entry["max_pause_ms"] = max(entry["max_pause_ms"], r["pause_ms"])
    slow = [
        {"t_s": round(r["t"] - started_at, 1), "generation": r["gc"], "pause_ms": r["pause_ms"]}
        for r in gcs
        if r["pause_ms"] >= slow_gc_ms
    ]
    steps = []
    for before, after in itertools.pairwise(samples):
        rise = after.get("rssanon_mib", 0) - before.get("rssanon_mib", 0)
        if rise < STEP_MIB:
            continue
        moved = {
            key: after.get(key, 0) - before.get(key, 0)
            for key in ("heap_mib", "mmap_mib", "in_use_mib", "py_blocks")
        }
        steps.append({"t_s": round(after["t"] - started_at, 1), "anon_mib": rise, **moved})
    return {
        "gc": per_generation,
        "slow_gc": slow,
        "rss_steps": steps,
        "last": samples[-1] if samples else None,
    }


if __name__ == "__main__":
    trace_and_run(Path(sys.argv[1]), sys.argv[2:])
