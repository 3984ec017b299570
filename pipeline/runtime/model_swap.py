"""When the served model version changes: the decisions of a live swap, step by step.

A :class:`~pipeline.models.watch.ModelWatcher` loads a promoted version on its thread
(:meth:`~pipeline.models.loader.ModelLoader.load_local`). :class:`ModelSwap` decides, at each
step of the loop, what happens to it, and carries it out after the step
(:meth:`ModelSwap.follow`; the loop, :mod:`pipeline.runtime.loop`, then serves what it returns):

1. **offer** (before the step's agreement): the loaded version's generation (or that of a
   failed load) and whether this process's decoded events are all batched. The stepper
   agrees on them (:mod:`pipeline.runtime.stepping`; with several ranks one ``all_reduce``).
2. **hold**: once every rank offers the same generation, loaded, the swap is committed: the
   loop stops decoding new messages (they wait in the consumer's backlog), so that every
   event already given candidates by the old version's retrieval index is scored by the old
   version, and the open batch fills from what was decoded and closes as usual.
3. **swap** (after the step's batch is submitted, when every rank's batcher is empty): the loop
   publishes the batch in flight (no forward runs during a swap), :meth:`ModelSwap.complete`
   builds what is left (the sharded model: collective, on the loop's thread, every rank at
   this same step; see below), the ranks agree that it worked, the scoring thread warms the
   new scorer up, and the processor, the executor and the retriever switch to the new version
   together. Every event of a batch is scored by one version, and its retrieved candidates
   come from that version's index.
4. **discard**: a version that failed to load anywhere is dropped everywhere: the old one
   keeps serving, each process logs one line and counts it (``model_load_failures``).

Why the sharded load is collective on the loop's thread, at an agreed step: planning and
sharding a ``DistributedModelParallel`` (DDP's broadcast of the dense layers) and loading a
DCP checkpoint are collectives on the default process group, which the served model's
forwards use on the scoring thread. Two threads issuing collectives on one group interleave
them differently on each rank (a hang), and a second group for loads would have to be NCCL on
GPUs, where concurrent communicators can deadlock. So everything that needs no other rank
(reading and checking the checkpoint, the catalogue, the retrieval index) happens on the
watcher's thread, and only the collective part runs at an agreed step, when no forward is in
flight; the step agreement itself runs on the stepper's own gloo group. The price: with
several ranks the loop pauses for the sharded load and the warm-up (one process: only for the
warm-up). ``streamrank bench swap`` measures the effect on latency.
"""

from __future__ import annotations

import enum
import logging
import time
from typing import TYPE_CHECKING

from pipeline.models.loader import ModelLoader, PendingModel, ServedModel
from pipeline.models.watch import LoadedModel, ModelWatcher
from pipeline.runtime.processor import BatchProcessor
from pipeline.runtime.stepping import StepDecision, Stepper, SwapOffer

if TYPE_CHECKING:
    from pipeline.observability.metrics import Metrics

__all__ = ["ModelSwap", "SwapAction"]

log = logging.getLogger(__name__)


class SwapAction(enum.Enum):
    """What the loop does about the model at the end of a step."""

    NONE = "none"
    HOLD = "hold"
    """A swap is agreed: decode nothing new until every rank's batcher is empty."""
    SWAP = "swap"
    """Swap now (:meth:`ModelSwap.complete`, then warm up and switch)."""
    DISCARD = "discard"
    """The agreed version failed to load somewhere: drop it, keep serving."""


class ModelSwap:
    """The swap decisions of one process (see the module docstring).

    Args:
        watcher: loads promoted versions (its loader: :meth:`ModelLoader.load_local`).
        loader: finishes a loaded version (:meth:`ModelLoader.complete`).
        metrics: the served model's embedding bytes after a swap (``None``: not recorded).

    Example::

        swap = ModelSwap(ModelWatcher(root, loader.load_local, version), loader)
        offer = swap.offer(drained=not batcher.waiting)
        step = stepper.agree(LocalStep(..., offer=offer))
        if swap.decide(step.swap, batches_empty) is SwapAction.SWAP:
            served = swap.complete(stepper)
    """

    def __init__(
        self,
        watcher: ModelWatcher[PendingModel],
        loader: ModelLoader,
        metrics: Metrics | None = None,
    ) -> None:
        self.watcher = watcher
        self._loader = loader
        self._metrics = metrics
        self._candidate: LoadedModel[PendingModel] | None = None
        self._committed = False
        self._resolved = 0
        """The latest generation swapped in or discarded (never offered again)."""
        self._built_s = 0.0

    @property
    def holding(self) -> bool:
        """A swap is agreed: the loop decodes nothing new until it happens."""
        return self._committed

    def start(self) -> None:
        """Start watching the versions directory."""
        self.watcher.start()

    def stop(self) -> None:
        """Stop watching (waits for a load in progress, at most a few seconds)."""
        self.watcher.stop(timeout_s=5.0)

    def offer(self, drained: bool) -> SwapOffer:
        """This process's side of the step's agreement.

        Args:
            drained: nothing decoded waits to join a batch.

        Returns:
            The generation of the loaded version (ok) or of a failed load (not ok); generation
            0 when there is neither.
        """
        watcher = self.watcher
        if not self._committed:
            loaded = watcher.take_loaded()
            if loaded is not None:
                self._candidate = loaded  # a newer load replaces one not agreed on yet
            stale = self._candidate is not None and (
                self._candidate.generation < watcher.latest_generation()
            )
            if stale:  # promoted over (or rolled back) since: the watcher follows the pointer
                self._candidate = None
        candidate = self._candidate
        if candidate is not None:
            return SwapOffer(candidate.generation, ok=True, drained=drained)
        failed = watcher.failed_generation()
        if failed > self._resolved:
            return SwapOffer(failed, ok=False, drained=drained)
        return SwapOffer(drained=drained)

    def follow(
        self, step: StepDecision, processor: BatchProcessor, stepper: Stepper, collective: bool
    ) -> ServedModel | None:
        """After a step: swap in the agreed version once every batcher is empty.

        The processor's scorer (and, by the caller, the retriever's index) switch between two
        batches (the batch in flight is published first), so every event of a batch is scored
        by one version, with candidates retrieved by that version.

        Args:
            step: the step's agreed decision.
            processor: publishes the batch in flight, then warms the new scorer up and switches.
            stepper: agrees that the build worked on every rank.
            collective: ranks of a sharded model (a failed warm-up cannot be survived apart).

        Returns:
            The version serving from now on; ``None`` when nothing changed.
        """
        action = self.decide(step.swap, batches_empty=step.run or step.rows == 0)
        if action is not SwapAction.SWAP:
            return None
        processor.collect(wait=True)  # no forward in flight from here on
        served = self.complete(stepper)
        if served is None:
            return None
        start = time.perf_counter()
        try:
            processor.swap_scorer(served.scorer)  # warmed up on the scoring thread
        except Exception as exc:
            if collective:  # a collective warm-up failed: the ranks cannot go on apart
                raise
            self.failed(served, exc)
            return None
        self.swapped(served, warm_up_s=time.perf_counter() - start)
        return served

    def decide(self, agreed: SwapOffer, batches_empty: bool) -> SwapAction:
        """What to do after this step, from what every rank offered.

        Args:
            agreed: the step's agreed offer (``StepDecision.swap``).
            batches_empty: every rank's open batch is empty after this step (it ran, or
                nobody had events).

        Returns:
            The :class:`SwapAction` (the same on every rank: it depends on agreed values and on
            state that only agreed values change).
        """
        generation = agreed.generation
        if generation <= self._resolved:
            return SwapAction.NONE
        if not agreed.ok:
            self._resolved = generation
            self._committed = False
            candidate, self._candidate = self._candidate, None
            if candidate is not None and candidate.generation == generation:
                self.watcher.report_failure(candidate.version, "it failed to load on another rank")
            return SwapAction.DISCARD
        if not self._committed:
            self._committed = True
            version = self._candidate.version if self._candidate is not None else "?"
            log.info("model version %s is ready everywhere: swapping it in next", version)
        if agreed.drained and batches_empty:
            return SwapAction.SWAP
        return SwapAction.HOLD

    def complete(self, stepper: Stepper) -> ServedModel | None:
        """Build the agreed version (collective with several ranks); call it at the step
        :meth:`decide` answered ``SWAP``, with no forward in flight.

        Args:
            stepper: agrees that the build worked on every rank.

        Returns:
            The new version, to warm up and switch to (then :meth:`swapped`); ``None`` when it
            failed on some rank (logged and counted; the old version keeps serving).
        """
        candidate = self._candidate
        assert candidate is not None and self._committed, "complete() without an agreed swap"
        self._candidate, self._committed = None, False
        self._resolved = candidate.generation
        served: ServedModel | None = None
        error = ""
        log.info("swapping model version %s in (agreed)", candidate.version)
        start = time.perf_counter()
        try:
            served = self._loader.complete(candidate.model)
        except Exception as exc:  # a version that cannot be built keeps the old one serving
            error = f"{type(exc).__name__}: {exc}"
        if not stepper.all_ok(served is not None):
            self.watcher.report_failure(candidate.version, error or "it failed on another rank")
            return None
        self._built_s = time.perf_counter() - start
        return served

    def swapped(self, served: ServedModel, warm_up_s: float) -> None:
        """The loop serves ``served`` now (metrics, the watcher's served version).

        Args:
            served: the new version.
            warm_up_s: how long its warm-up on the scoring thread took (logged with the time
                :meth:`complete` took: the loop's pause for the swap).
        """
        log.info(
            "model version %s serving: the loop paused %.3fs for it (%.3fs built here, "
            "%.3fs warm-up)",
            served.version,
            self._built_s + warm_up_s,
            self._built_s,
            warm_up_s,
        )
        self.watcher.swapped(served.version)
        if self._metrics is not None:
            self._metrics.embedding_bytes.set(served.scorer.embedding_bytes())

    def failed(self, served: ServedModel, error: Exception) -> None:
        """``served`` could not start serving (its warm-up failed): the old version serves on."""
        self.watcher.report_failure(served.version, f"warm-up: {type(error).__name__}: {error}")
