"""Score: the served ranker, one forward per batch, then top-K per event.

:class:`Scorer` adapts the model (single-process or sharded) to batches; :class:`ForwardExecutor`
runs each batch's forward on a scoring thread, at most one in flight, and hands the result to
the publish stage in batch order.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from model.checkpoint import load_checkpoint
from model.compile import maybe_compile
from model.device import rank_device
from model.features import FeatureColumns, build_model_input
from model.inference import score_probabilities
from model.memory import embedding_bytes
from model.model_input import ModelInput, padding_input, warm_up_input
from model.options import CompileMode, Precision
from model.quantize import QuantDtype, quantize_ranker
from model.ranker import Ranker
from model.spec import FeatureSpec
from model.topk import TopK, top_k_per_event
from pipeline.faults import FaultInjector
from pipeline.metrics import Metrics
from pipeline.model_settings import ModelSettings
from pipeline.stages.batch import EventColumns
from pipeline.stages.commit import Checkpoint
from pipeline.stages.enrich import Enrichment
from pipeline.stages.isolate import is_isolatable
from pipeline.stages.transfer import DeviceTransfer, StagedInput

log = logging.getLogger(__name__)


def pick_device(setting: str) -> torch.device:
    """``auto`` -> what a rank uses (:func:`model.device.rank_device`): ``cuda:{LOCAL_RANK}``
    when a GPU is present, else ``cpu``."""
    if setting != "auto":
        return torch.device(setting)
    return rank_device(int(os.environ.get("LOCAL_RANK", "0")))


@dataclass
class ScoredBatch:
    """Top-K result of a batch, in item ids.

    Attributes:
        counts: int64[E] items per event.
        item_ids: int64[sum(counts)] event-major, best first.
        scores: float64[sum(counts)].
    """

    counts: npt.NDArray[np.int64]
    item_ids: npt.NDArray[np.int64]
    scores: npt.NDArray[np.float64]


class Scorer:
    """Runs the ranker on batches.

    Args:
        ranker: the model: a :class:`~model.ranker.Ranker`, or any module with the same
            ``forward(dense, sparse) -> logits`` (a DistributedModelParallel-wrapped ranker).
        spec: its feature spec.
        model_version: written into every Recommendation.
        device: where the forward runs.

    Example::

        scorer = Scorer.from_checkpoint(Path("artifacts/model"))
        probs = scorer.forward(scorer.model_input(feature_columns))
        scored = scorer.top_k(probs, events)
    """

    def __init__(
        self,
        ranker: nn.Module,
        spec: FeatureSpec,
        model_version: str,
        device: torch.device,
        precision: Precision | str = Precision.FP32,
    ) -> None:
        self.ranker = ranker.to(device).eval() if isinstance(ranker, Ranker) else ranker.eval()
        self.spec = spec
        self.model_version = model_version
        self.device = device
        self.precision = Precision(precision)
        self._transfer = DeviceTransfer(device) if device.type == "cuda" else None

    @classmethod
    def from_settings(cls, model: ModelSettings, batch_rows: int) -> Scorer:
        """The served model as ``[model]`` configures it (checkpoint, device, quantization,
        compile, precision).

        A compiled model, or one on a GPU, is warmed up at ``batch_rows`` and half of it before
        this returns, i.e. before the pipeline joins the consumer group.
        """
        warm = model.compile or pick_device(model.device).type == "cuda"
        return cls.from_checkpoint(
            model.checkpoint,
            model.device,
            model.quantize,
            model.compile,
            precision=model.precision,
            compile_mode=model.compile_mode,
            warm_up_rows=(batch_rows, max(1, batch_rows // 2)) if warm else (),
        )

    @classmethod
    def from_checkpoint(
        cls,
        path: Path,
        device: str = "auto",
        quantize: str = "fp32",
        compile: bool = False,
        *,
        precision: Precision | str = Precision.FP32,
        compile_mode: CompileMode | str = CompileMode.DEFAULT,
        warm_up_rows: Sequence[int] = (),
    ) -> Scorer:
        """Load a single-process checkpoint for serving.

        Args:
            path: checkpoint directory.
            device: ``auto``, ``cpu`` or ``cuda:N``.
            quantize: embedding storage, ``fp32``/``fp16``/``int8`` (TorchRec quantization).
            compile: ``torch.compile`` the model.
            precision: forward precision (:mod:`model.precision`).
            compile_mode: a :class:`~model.options.CompileMode`.
            warm_up_rows: batch sizes to run once before returning (see :meth:`warm_up`).
        """
        target = pick_device(device)
        ranker, meta = load_checkpoint(path, device=target)
        fp32_bytes = embedding_bytes(ranker)
        served: nn.Module = ranker
        if QuantDtype(quantize) is not QuantDtype.FP32:
            served = quantize_ranker(ranker, quantize)
            log.info(
                "embedding tables as %s: %.1f MiB (fp32 %.1f MiB)",
                quantize,
                embedding_bytes(served) / 2**20,
                fp32_bytes / 2**20,
            )
        served = maybe_compile(served, compile, mode=compile_mode)
        log.info("loaded model %s from %s onto %s", meta.model_version, path, target)
        scorer = cls(served, meta.spec, meta.model_version, target, precision)
        scorer.warm_up(warm_up_rows)
        return scorer

    def warm_up(self, batch_rows: Sequence[int]) -> float:
        """Run one forward and top-K per size in ``batch_rows`` (compiles, autotunes, and
        initialises the device's libraries) so that no consumed partition waits on it.

        Args:
            batch_rows: row counts; two different ones let ``torch.compile`` settle on
                dynamic shapes.

        Returns:
            Seconds it took.
        """
        start = time.perf_counter()
        for rows in batch_rows:
            inp = warm_up_input(self.spec, rows)
            probs = self.forward(inp.to(self.device))
            counts = np.ones(rows, dtype=np.int64)
            top_k_per_event(probs, counts, counts)
        seconds = time.perf_counter() - start
        if batch_rows:
            log.info("warmed up on %s rows in %.1fs", list(batch_rows), seconds)
        return seconds

    def embedding_bytes(self) -> int:
        """Bytes of embedding tables held by this process (quantized or not)."""
        return embedding_bytes(self.ranker)

    def model_input(self, features: FeatureColumns) -> ModelInput:
        """Feature columns -> dense tensor + KJT on the model's device (synchronously)."""
        inp = build_model_input(features, self.spec)
        return inp if self.device.type == "cpu" else inp.to(self.device)

    def stage(self, features: FeatureColumns) -> StagedInput:
        """Feature columns -> model input on its way to the model's device: on a GPU the copy
        runs asynchronously on a copy stream (:mod:`pipeline.stages.transfer`)."""
        inp = build_model_input(features, self.spec)
        if self._transfer is None:
            return StagedInput(inp if self.device.type == "cpu" else inp.to(self.device))
        return self._transfer.to_device(inp)

    def forward(self, inp: ModelInput, pad_to: int | None = None) -> torch.Tensor:
        """Click probabilities [R] (one forward, no autograd).

        Args:
            inp: the batch, on the model's device.
            pad_to: ranks of a sharded model pad to the agreed row count; padding scores are
                dropped.

        See :func:`model.inference.score_probabilities`.
        """
        return score_probabilities(self.ranker, inp, pad_to, self.precision)

    def forward_padding(self, rows: int) -> None:
        """Join a collective forward with padding only (this rank has no events)."""
        self.forward(padding_input(self.spec, rows, self.device))

    def top_k(self, probs: torch.Tensor, events: EventColumns) -> ScoredBatch:
        """Best ``min(num_results, candidates)`` items of every event."""
        top: TopK = top_k_per_event(probs, events.candidate_counts, events.num_results)
        return ScoredBatch(
            counts=top.counts,
            item_ids=events.candidate_ids[top.row_index],
            scores=top.scores.astype(np.float64),
        )


@dataclass
class PreparedBatch:
    """A closed batch ready for its forward.

    Attributes:
        events: the decoded events as columns.
        enrichment: their Redis features.
        checkpoint: the offsets its records will guard (cut, not sealed yet).
        staged: dense tensor + KJT on (or being copied to) the model's device.
    """

    events: EventColumns
    enrichment: Enrichment
    checkpoint: Checkpoint
    staged: StagedInput


ScoredCallback = Callable[[PreparedBatch, ScoredBatch], None]
"""Called on the loop's thread with each finished batch, in batch order (the publish step)."""

FailedCallback = Callable[[PreparedBatch, Exception], None]
"""Called on the loop's thread instead of the publish step when a batch's forward, top-K or
publish raised an error that may come from its events (see :mod:`pipeline.stages.isolate`)."""


class ForwardExecutor:
    """Runs each batch's forward and top-K on one scoring thread.

    With ``overlap`` the forward of batch n runs while the loop consumes and prepares batch
    n+1; without it :meth:`submit` returns only after the batch is published. Either way at
    most one forward is in flight, and a batch is handed to ``on_scored`` (on the caller's
    thread) before the next one is submitted, so batches are published in order.

    Args:
        scorer: the model.
        metrics: the ``forward`` stage time.
        on_scored: the publish step.
        overlap: keep one forward in flight while the loop goes on.
        collective: ranks of a sharded model pad every forward to the agreed row count.
        on_failed: isolates the events of a failed batch (single process only: a collective
            forward cannot be retried by one rank alone, so ranks let the error propagate).
        faults: TEST HOOK (:mod:`pipeline.faults`), ``None`` in production.

    Example::

        executor = ForwardExecutor(scorer, metrics, publish, overlap=False, collective=False)
        executor.submit(batch)
        executor.finish()
    """

    def __init__(
        self,
        scorer: Scorer,
        metrics: Metrics,
        on_scored: ScoredCallback,
        overlap: bool,
        collective: bool,
        on_failed: FailedCallback | None = None,
        faults: FaultInjector | None = None,
    ) -> None:
        self._scorer = scorer
        self._on_failed = None if collective else on_failed
        self._faults = faults
        self._metrics = metrics
        self._on_scored = on_scored
        self._overlap = overlap
        self._collective = collective
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
        self._inflight: tuple[PreparedBatch | None, Future[ScoredBatch | None]] | None = None

    def submit(self, batch: PreparedBatch, pad_rows: int | None = None) -> None:
        """Start ``batch``'s forward (after publishing the one in flight).

        Args:
            batch: the batch.
            pad_rows: the row count agreed by the ranks (ignored for a single process).
        """
        self.finish()
        pad = pad_rows if self._collective else None
        self._inflight = (batch, self._pool.submit(self._forward, batch, pad))
        if not self._overlap:
            self.finish()

    def submit_padding(self, rows: int) -> None:
        """Join a collective forward with padding only (this rank has no events)."""
        self.finish()
        self._inflight = (None, self._pool.submit(self._scorer.forward_padding, rows))

    def finish(self, wait: bool = True) -> None:
        """Publish the in-flight batch once its forward is done.

        Args:
            wait: block until it is done; ``False`` publishes only if it already is.

        Raises:
            Exception: whatever the forward or the publish step raised, unless ``on_failed``
                took it (an error that may come from the batch's events).
        """
        inflight = self._inflight
        if inflight is None or (not wait and not inflight[1].done()):
            return
        self._inflight = None
        batch, future = inflight
        try:
            scored = future.result()
            if batch is not None and scored is not None:
                self._on_scored(batch, scored)
        except Exception as exc:
            if batch is None or self._on_failed is None or not is_isolatable(exc):
                raise
            self._on_failed(batch, exc)

    def shutdown(self) -> None:
        """Stop the scoring thread (after the forward in flight, if any, returns)."""
        self._pool.shutdown(wait=True)

    def _forward(self, batch: PreparedBatch, pad_rows: int | None) -> ScoredBatch:
        start = time.perf_counter()
        scorer = self._scorer
        if self._faults is not None:
            self._faults.check("forward", batch.events.event_ids)
        scored = scorer.top_k(scorer.forward(batch.staged.ready_input(), pad_rows), batch.events)
        self._metrics.stage_seconds.labels(stage="forward").observe(time.perf_counter() - start)
        return scored
