"""``worker_transfer``: the serving path's copy and top-K, driven from a worker thread.

Only torch and ``model.*`` are imported, so this runs on the GPU machine without the
pipeline's dependencies. Batches of several sizes (growing and shrinking, so the pinned staging
buffers grow and are reused) go through the serving arrangement: the main thread stages batch
n+1 through :class:`model.serving.transfer.DeviceTransfer` (pinned buffers, copy stream, event)
while a scoring thread, bound to the device with :func:`model.serving.device.bind_thread`, runs
batch n's forward and :func:`model.serving.topk.top_k_per_event`. Each batch's top-K is compared
with the plain path: ``inp.to(device)``, forward and top-K on the main thread. On a GPU the
synchronisations of the overlapped run are counted with ``torch.cuda.set_sync_debug_mode("warn")``
(the design: one per batch, reading its top-K). On a CPU there is nothing to copy: the input is used
in place, and the threading, sizes and top-K still run.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from model.features.build import FeatureColumns, build_model_input
from model.features.spec import FeatureSpec
from model.ranker import Ranker
from model.serving.device import bind_thread
from model.serving.inference import score_probabilities
from model.serving.topk import TopK, top_k_per_event
from model.serving.transfer import DeviceTransfer, StagedInput
from model.synthetic import SyntheticWorld, feature_columns
from scripts.gpucheck.common import TOLERANCE, sample_events, sync
from scripts.gpucheck.model_sections import on_device

RESULTS_PER_EVENT = 10


@contextmanager
def counted_synchronizations(device: torch.device) -> Iterator[list[int]]:
    """Count the host-device synchronisations inside the block (``[count]`` once it ends;
    ``[-1]`` on a CPU, where there are none to count).

    ``set_sync_debug_mode`` is process-wide and warns on the thread that synchronises; the
    warnings are collected from every thread (``catch_warnings`` swaps the module's hook).
    """
    box = [-1]
    if device.type != "cuda":
        yield box
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield box
        finally:
            torch.cuda.set_sync_debug_mode("default")
    box[0] = sum("synchroniz" in str(w.message) for w in caught)


def _top_k(model: Ranker, staged: StagedInput, cols: FeatureColumns) -> TopK:
    probs = score_probabilities(model, staged.ready_input())
    wanted = np.full(cols.num_events, RESULTS_PER_EVENT, dtype=np.int64)
    return top_k_per_event(probs, cols.candidate_counts, wanted)


def worker_transfer(
    ranker: Ranker,
    world: SyntheticWorld,
    spec: FeatureSpec,
    device: torch.device,
    sizes: list[int],
) -> dict[str, Any]:
    """Overlapped staging + worker-thread forward and top-K against the plain path.

    Args:
        ranker: the CPU model (copied to ``device``).
        world: where the batches come from.
        spec: the model's spec.
        device: the device under test.
        sizes: rows per batch, in order (vary them: up, down, repeated).

    Returns:
        ``{"transfer": ..., "batches": [{"rows", "events", "top_k_equal", "max_abs_diff"}],
        "seconds_plain", "seconds_overlapped", "synchronizations",
        "synchronizations_per_batch", "ok"}``; ``synchronizations`` is ``null`` on a CPU.
    """
    model = on_device(ranker, spec, device)
    columns = [
        feature_columns(sample_events(world, rows, seed=100 + i), world, spec)
        for i, rows in enumerate(sizes)
    ]
    inputs = [build_model_input(cols, spec) for cols in columns]

    _top_k(model, StagedInput(inputs[0].to(device)), columns[0])  # untimed: first-use costs
    sync(device)
    start = time.perf_counter()
    plain = [
        _top_k(model, StagedInput(inp.to(device)), cols)
        for inp, cols in zip(inputs, columns, strict=True)
    ]
    sync(device)
    seconds_plain = time.perf_counter() - start

    transfer = DeviceTransfer(device) if device.type == "cuda" else None

    def stage(i: int) -> StagedInput:
        return StagedInput(inputs[i]) if transfer is None else transfer.to_device(inputs[i])

    overlapped: list[TopK] = []
    with (
        ThreadPoolExecutor(1, "scoring", initializer=bind_thread, initargs=(device,)) as worker,
        counted_synchronizations(device) as synchronizations,
    ):
        start = time.perf_counter()
        inflight: Future[TopK] | None = None
        for i in range(len(inputs)):
            staged = stage(i)  # batch i is copied while batch i-1 is scored
            if inflight is not None:
                overlapped.append(inflight.result())
            inflight = worker.submit(_top_k, model, staged, columns[i])
        if inflight is not None:
            overlapped.append(inflight.result())
        sync(device)
        seconds_overlapped = time.perf_counter() - start

    batches = []
    for inp, cols, want, got in zip(inputs, columns, plain, overlapped, strict=True):
        counts_equal = np.array_equal(want.counts, got.counts)
        diff: float | None = None  # None: not even the result counts agree
        if counts_equal:
            diff = float(np.abs(want.scores - got.scores).max()) if want.scores.size else 0.0
        batches.append(
            {
                "rows": inp.num_rows,
                "events": cols.num_events,
                "top_k_equal": counts_equal and np.array_equal(want.row_index, got.row_index),
                "max_abs_diff": diff,
            }
        )
    count = synchronizations[0]
    return {
        "transfer": "DeviceTransfer (pinned buffers, copy stream)"
        if transfer is not None
        else "none: a CPU uses the input in place",
        "batches": batches,
        "seconds_plain": round(seconds_plain, 4),
        "seconds_overlapped": round(seconds_overlapped, 4),
        "synchronizations": None if count < 0 else count,
        "synchronizations_per_batch": None if count < 0 else round(count / len(inputs), 3),
        "ok": all(
            b["top_k_equal"] and b["max_abs_diff"] is not None and b["max_abs_diff"] <= TOLERANCE
            for b in batches
        ),
    }
