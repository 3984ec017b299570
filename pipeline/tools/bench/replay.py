"""Record a drain's real batches as the scorer receives them, and replay them alone.

Where does the forward's time go inside the pipeline? :class:`RecordingScorer` is a decorator
the benchmark puts around the served :class:`~model.serving.Scorer` (the pipeline sees a
scorer; nothing in the serving code knows): each batch's model input, its rows, the seconds its
forward took in the pipeline, the thread it ran on and that thread's torch thread count are
kept (warm-up forwards are not). :func:`replay` then runs the same inputs through the same
scorer alone, on the calling thread with the same torch threads: forward time in the pipeline
over forward time alone, on identical batches, is what contention (the loop, librdkafka, the
broker, Redis on the same cores) and the pipeline's own effects (cache, allocator) cost.

A recording can be saved (:meth:`Recording.save`: the tensors with ``torch.save``, read back
with ``weights_only=True``; a JSON of the settings) and replayed later in a fresh process
(``streamrank bench model --replay DIR``), e.g. with other thread settings.

Example::

    recording = Recording()
    pipeline.scorer = RecordingScorer(pipeline.scorer, recording)   # before run()
    pipeline.run(exit_when_idle_s=2.0)
    alone = replay(scorer, recording.inputs(), seconds=3.0)
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.features.model_input import ModelInput, sparse_features
from model.serving import Scorer

__all__ = ["Recording", "RecordingScorer", "ReplayResult", "replay"]

MAX_RECORDED = 256
"""Batches kept at most (the first ones): about 1 MB each at 4,096 rows."""

BATCHES_FILE = "batches.pt"
META_FILE = "recording.json"


def thread_settings() -> dict[str, Any]:
    """The calling thread's torch threads and the OpenMP/MKL environment."""
    env = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "GOMP_SPINCOUNT")
    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        **{name: os.environ.get(name) for name in env},
    }


@dataclass
class Recording:
    """Batches a :class:`RecordingScorer` saw.

    Attributes:
        limit: batches kept at most.
        batches: each batch's model input (on the scorer's device).
        forward_s: each one's forward seconds in the pipeline.
        threads: each one's thread name and torch thread count there.
        skipped: forwards beyond ``limit``.
    """

    limit: int = MAX_RECORDED
    batches: list[ModelInput] = field(default_factory=list)
    forward_s: list[float] = field(default_factory=list)
    threads: list[tuple[str, int]] = field(default_factory=list)
    skipped: int = 0

    def add(self, inp: ModelInput, seconds: float) -> None:
        """One batch's forward (kept while under ``limit``)."""
        if len(self.batches) >= self.limit:
            self.skipped += 1
            return
        self.batches.append(inp)
        self.forward_s.append(seconds)
        self.threads.append((threading.current_thread().name, torch.get_num_threads()))

    @property
    def rows(self) -> list[int]:
        """Rows of each recorded batch."""
        return [inp.num_rows for inp in self.batches]

    def summary(self) -> dict[str, Any]:
        """Batches, rows and forward time in the pipeline, and where the forwards ran."""
        rows, seconds = sum(self.rows), sum(self.forward_s)
        return {
            "batches": len(self.batches),
            "skipped": self.skipped,
            "rows": rows,
            "forward_s": round(seconds, 4),
            "forward_rows_per_s": round(rows / seconds, 1) if seconds else None,
            "forward_threads": sorted({f"{name} ({n} torch threads)" for name, n in self.threads}),
        }

    def save(self, directory: Path, about: dict[str, Any]) -> Path:
        """Write the batches (CPU tensors) and a JSON of how they were recorded.

        Args:
            directory: created if needed; ``batches.pt`` and ``recording.json`` go there.
            about: more to keep in the JSON (model version, checkpoint, settings).

        Returns:
            ``directory``.
        """
        directory.mkdir(parents=True, exist_ok=True)
        tensors = [
            {
                "dense": inp.dense.cpu(),
                "values": inp.sparse.values().cpu(),
                "lengths": inp.sparse.lengths().cpu(),
                "keys": list(inp.sparse.keys()),
                "length_per_key": list(inp.sparse.length_per_key()),
            }
            for inp in self.batches
        ]
        torch.save(tensors, directory / BATCHES_FILE)
        meta = {
            **about,
            **self.summary(),
            "batch_rows": self.rows,
            "pipeline_forward_s": [round(s, 6) for s in self.forward_s],
            "recorded_with": thread_settings(),
        }
        (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return directory

    @classmethod
    def load(cls, directory: Path, device: torch.device) -> tuple[Recording, dict[str, Any]]:
        """A saved recording, its inputs on ``device``, and its JSON.

        Raises:
            FileNotFoundError: ``directory`` holds no recording.
        """
        meta = json.loads((directory / META_FILE).read_text())
        saved = torch.load(directory / BATCHES_FILE, weights_only=True)
        recording = cls(limit=len(saved))
        for batch, seconds in zip(saved, meta["pipeline_forward_s"], strict=True):
            rows = int(batch["dense"].shape[0])
            sparse = sparse_features(
                batch["keys"], batch["values"], batch["lengths"], rows, batch["length_per_key"]
            )
            inp = ModelInput(dense=batch["dense"], sparse=sparse).to(device)
            recording.batches.append(inp)
            recording.forward_s.append(float(seconds))
        return recording, meta


class RecordingScorer(Scorer):
    """``inner``, recording each batch's forward into ``recording`` (warm-up excluded).

    Every attribute is the inner scorer's (``__getattr__``): :class:`~model.serving.Scorer`'s
    other methods (``stage``, ``top_k``...) run as they are on the inner scorer's model, device
    and spec, so the pipeline scores exactly as it would without it (the recording keeps
    references: no copies on the forward's path). Padding forwards are not recorded.

    Args:
        inner: the served scorer.
        recording: where the batches go.
    """

    def __init__(self, inner: Scorer, recording: Recording) -> None:  # no super(): a decorator
        self.inner = inner
        self.recording = recording
        self._warming = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def forward(
        self, inp: ModelInput, pad_to: int | None = None, rows: int | None = None
    ) -> torch.Tensor:
        start = time.perf_counter()
        probs = self.inner.forward(inp, pad_to, rows)
        if not self._warming:
            self.recording.add(inp, time.perf_counter() - start)
        return probs

    def forward_padding(self, rows: int) -> None:
        self.inner.forward_padding(rows)

    def warm_up(self, batch_rows: Sequence[int]) -> float:
        self._warming = True
        try:
            return self.inner.warm_up(batch_rows)
        finally:
            self._warming = False


@dataclass(frozen=True)
class ReplayResult:
    """Recorded batches replayed alone.

    Attributes:
        passes: times every batch was scored.
        rows_per_s: rows scored per second of forward, over all passes.
        batch_ms: each batch's median forward milliseconds alone.
        pipeline_batch_ms: each batch's forward milliseconds in the pipeline.
    """

    passes: int
    rows_per_s: float
    batch_ms: list[float]
    pipeline_batch_ms: list[float]

    def as_dict(self) -> dict[str, Any]:
        """The figures, and the pipeline's forward time over the replay's (1: no loss)."""
        alone, inside = sum(self.batch_ms), sum(self.pipeline_batch_ms)
        ratios = [p / a for p, a in zip(self.pipeline_batch_ms, self.batch_ms, strict=True) if a]
        return {
            "passes": self.passes,
            "replay_rows_per_s": round(self.rows_per_s, 1),
            "replay_forward_ms": round(alone, 2),
            "pipeline_forward_ms": round(inside, 2),
            "pipeline_over_replay": round(inside / alone, 3) if alone else None,
            "per_batch_ratio_p50_p90": [round(float(np.quantile(ratios, q)), 3) for q in (0.5, 0.9)]
            if ratios
            else None,
            **thread_settings(),
        }


def replay(scorer: Scorer, recording: Recording, seconds: float) -> ReplayResult:
    """Score the recorded batches in order, again and again for about ``seconds`` (at least
    one pass after a warm pass), on this thread.

    Args:
        scorer: the model that scored them (same device).
        recording: the batches and their forward times in the pipeline.
        seconds: how long to replay.

    Returns:
        The :class:`ReplayResult`.

    Raises:
        ValueError: an empty recording.
    """
    batches = recording.batches
    if not batches:
        raise ValueError("nothing was recorded: no batch reached the forward")
    sync = torch.cuda.synchronize if scorer.device.type == "cuda" else (lambda: None)
    for inp in batches:  # warm pass (caches, allocator), not timed
        scorer.forward(inp)
    sync()
    times: list[list[float]] = [[] for _ in batches]
    passes, started = 0, time.perf_counter()
    while passes == 0 or time.perf_counter() - started < seconds:
        for i, inp in enumerate(batches):
            start = time.perf_counter()
            scorer.forward(inp)
            sync()
            times[i].append(time.perf_counter() - start)
        passes += 1
    total = sum(sum(t) for t in times)
    return ReplayResult(
        passes=passes,
        rows_per_s=sum(recording.rows) * passes / total,
        batch_ms=[float(np.median(t)) * 1000 for t in times],
        pipeline_batch_ms=[s * 1000 for s in recording.forward_s],
    )
