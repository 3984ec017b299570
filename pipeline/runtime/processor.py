"""One batch's path after batching: enrich -> features -> forward -> top-K -> publish.

:class:`BatchProcessor` is the one place that runs these steps, in this order, for a closed
batch and its checkpoint; the loop (:mod:`pipeline.runtime.loop`), the revocation handler
(:mod:`pipeline.runtime.rebalance`) and poison isolation all go through it.

- **prepare** (the loop's thread): one Redis round trip (:mod:`pipeline.stages.enrich.enricher`),
  the
  feature columns (:mod:`pipeline.stages.features`) and the model input on its way to the
  device (:meth:`model.serving.Scorer.stage`).
- **score** (the scoring thread, :mod:`pipeline.stages.score`): one forward and the top-K.
  With ``overlap`` the forward of batch n runs while the loop consumes and prepares batch
  n+1; batches are always published in order, one forward in flight at most.
- **publish** (the loop's thread, :mod:`pipeline.stages.publish`): one Recommendation per
  event; then the batch's checkpoint is sealed (the commit stage commits it once delivered).

A batch whose steps fail with an error that may come from its events is bisected
(:mod:`pipeline.runtime.isolation`): the events that fail alone are dead-lettered with
``processing_error``, the rest are scored. Ranks of a sharded model bisect the steps before the
forward on their own (no collective is involved); a batch that fails after the collective
forward (its local compute, top-K, encode) is bisected by every rank together
(:meth:`BatchProcessor.isolate_together`: each attempt is one collective forward, the other
ranks join it with padding), so a poison event never crashes the ranks. An exception raised
before a rank's part of a collective is not recoverable this way (the others wait in the
collective): like device and communication errors, it stops the ranks uncommitted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from model.serving import Scorer
from pipeline.observability.metrics import Metrics
from pipeline.observability.summary import RunSummary
from pipeline.runtime.isolation import bisect, is_isolatable
from pipeline.runtime.stepping import IsolationRounds
from pipeline.stages.dead_letter import DeadLetterSink
from pipeline.stages.enrich.enricher import BatchEnricher
from pipeline.stages.features import BuiltinFeatures, FeatureStager
from pipeline.stages.publish import EncodedBatch, RecommendationSink
from pipeline.stages.score import ForwardExecutor, ForwardFailed, score_batch
from pipeline.types import Batch, PreparedBatch, RejectedMessage, RejectReason, ScoredBatch

__all__ = ["BatchProcessor"]

log = logging.getLogger(__name__)


class BatchProcessor:
    """Enrich, featurise, score and publish closed batches (see the module docstring).

    Args:
        enricher: Redis features for a batch.
        executor: the scoring thread (holds the served model).
        sink: the output topic.
        dead_letters: where a poison event goes.
        metrics: stage timings.
        summary: the run's counts and latencies.
        overlap: keep one forward in flight while the loop goes on.
        collective: ranks of a sharded model (every forward is collective: pad to the agreed
            rows, never retry one alone).
        features: lays out a batch's model input (default: the built-in model's features).

    Example::

        processor = BatchProcessor(enricher, executor, sink, dlq, metrics, summary)
        processor.submit(Batch(events, messages, checkpointer.cut()))
        processor.collect(wait=True)
    """

    def __init__(
        self,
        enricher: BatchEnricher,
        executor: ForwardExecutor,
        sink: RecommendationSink,
        dead_letters: DeadLetterSink,
        metrics: Metrics,
        summary: RunSummary,
        *,
        overlap: bool = False,
        collective: bool = False,
        features: FeatureStager | None = None,
    ) -> None:
        self._enricher = enricher
        self._features = features or BuiltinFeatures()
        self._executor = executor
        self._sink = sink
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._summary = summary
        self._overlap = overlap
        self._collective = collective
        self._costs: list[tuple[int, float]] = []
        self._failed: list[tuple[Batch, Exception]] = []
        """Ranks of a sharded model: batches whose collective forward went through but whose
        scoring failed, waiting for :meth:`isolate_together`."""

    def submit(self, batch: Batch | None, pad_rows: int | None = None) -> None:
        """Prepare a batch and start its forward, after publishing the one in flight.

        Args:
            batch: the closed batch; ``None``: this rank has nothing to score (ranks of a
                sharded model still join the step's forward with ``pad_rows`` of padding).
            pad_rows: the row count the ranks agreed on (ignored for a single process).
        """
        self.collect(wait=True)
        pad = pad_rows if self._collective else None
        prepared = self._prepare_or_isolate(batch) if batch is not None else None
        if prepared is None:
            if pad:
                self._executor.start(None, pad)
            return
        self._executor.start(prepared, pad, here=not (self._overlap or self._collective))
        if not self._overlap:
            self.collect(wait=True)

    def collect(self, wait: bool = True) -> None:
        """Publish the batch in flight once its forward is done.

        Args:
            wait: block until it is done; ``False`` publishes only if it already is.

        Raises:
            Exception: what the forward or the publishing raised, when it cannot come from the
                batch's events (or the forward was collective).
        """
        try:
            done = self._executor.take(wait)
        except ForwardFailed as failed:
            if failed.prepared is None or not is_isolatable(failed.error):
                raise failed.error from None
            if self._collective:  # bisected together, at the next agreed step
                log.warning("batch failed after the collective forward (%s)", failed.error)
                self._failed.append((failed.prepared.batch, failed.error))
            else:
                self._isolate(failed.prepared.batch, failed.error)
            return
        if done is not None:
            self._publish_or_isolate(*done)

    @property
    def needs_isolation(self) -> bool:
        """Whether a batch of this rank waits to be bisected by all ranks together."""
        return bool(self._failed)

    def isolate_together(self, rounds: IsolationRounds) -> None:
        """Every rank of a sharded model, in lockstep: bisect this rank's failed batches, each
        attempt one collective forward that the other ranks join with padding, until no rank
        has anything left to try. Events that fail alone are dead-lettered.

        Args:
            rounds: agrees, per attempt, whether some rank still needs one and the rows to pad
                to (:meth:`pipeline.runtime.stepping.CollectiveStepper.agree_attempt`).
        """
        self.collect(wait=True)  # the batch in flight (collective too) is published first
        failed, self._failed = self._failed, []
        for batch, error in failed:
            log.warning("bisecting a batch of %d events with every rank", batch.events.num_events)

            def attempt(group: list[int], batch: Batch = batch) -> None:
                prepared = self._prepare(_take(batch, group))  # local: may fail alone
                pad = rounds.agree_attempt(prepared.batch.events.num_rows)
                self._executor.start(prepared, pad)
                done = self._executor.take(wait=True)
                if done is not None:
                    self._publish(done[0], self._sink.encode_batch(*done))

            found = bisect(list(range(batch.events.num_events)), _unwrapped(attempt), error)
            self._dead_letter(batch, found.failed)
            batch.checkpoint.seal()
        while (pad := rounds.agree_attempt(None)) is not None:
            self._executor.start(None, pad)  # another rank's attempt: join it with padding
            self._executor.take(wait=True)

    def process(self, batch: Batch) -> None:
        """The whole path for ``batch`` now, on this thread (e.g. before a revocation)."""
        self.submit(batch)
        self.collect(wait=True)

    @property
    def scorer(self) -> Scorer:
        """The model that scores the next batch."""
        return self._executor.scorer

    def swap_scorer(self, scorer: Scorer) -> None:
        """Publish the batch in flight, then score every later batch with ``scorer`` (warmed
        up on the scoring thread first: :meth:`ForwardExecutor.swap`).

        Raises:
            Exception: what the warm-up raised (the old model keeps serving).
        """
        self.collect(wait=True)
        self._executor.swap(scorer)

    def close(self) -> None:
        """Stop the scoring thread."""
        self._executor.shutdown()

    def take_costs(self) -> list[tuple[int, float]]:
        """(rows, seconds from enrich to publish) of each batch published since the last call
        (the loop's batch policy learns from them: :mod:`pipeline.runtime.batch_policy`)."""
        costs, self._costs = self._costs, []
        return costs

    @property
    def busy(self) -> bool:
        """Whether a forward is in flight (``overlap``)."""
        return self._executor.busy

    def _prepare(self, batch: Batch) -> PreparedBatch:
        """Enrich and featurise a batch; its model input starts on its way to the device."""
        start = time.perf_counter()
        events, metrics = batch.events, self._metrics
        with metrics.stage("enrich"):
            enrichment = self._enricher.enrich(events.user_ids, events.candidate_ids)
        with metrics.stage("features"):
            staged = self._features.stage(events, enrichment, self._executor.scorer)
        return PreparedBatch(batch, enrichment, staged, time.perf_counter() - start)

    def _publish(self, prepared: PreparedBatch, encoded: EncodedBatch) -> None:
        """Produce the batch's Recommendations (encoded: nothing can fail for an event now)."""
        with self._metrics.stage("produce"):
            latency_s = self._sink.send(prepared, encoded)
        events = prepared.batch.events
        self._summary.record_batch(events.num_events, events.num_rows, latency_s)

    def _run(self, batch: Batch) -> None:
        """The whole path for ``batch`` on this thread, raising what fails (for bisection)."""
        prepared = self._prepare(batch)
        scored = score_batch(self._executor.scorer, prepared)
        self._publish(prepared, self._sink.encode_batch(prepared, scored))

    def _prepare_or_isolate(self, batch: Batch) -> PreparedBatch | None:
        """:meth:`_prepare`; when it fails for some events, what is left to score (``None``:
        nothing is left for the executor, or the batch was handled synchronously)."""
        try:
            return self._prepare(batch)
        except Exception as exc:
            if not is_isolatable(exc):
                raise
            if not self._collective:
                self._isolate(batch, exc)
                return None
            return self._isolate_before_forward(batch, exc)

    def _publish_or_isolate(self, prepared: PreparedBatch, scored: ScoredBatch) -> None:
        """Encode the batch (bisected when that fails for some events), then produce it and
        seal its checkpoint. A failure while producing is never retried here: the records
        already sent would be sent twice; it propagates and the batch stays uncommitted."""
        start = time.perf_counter()
        try:
            encoded = self._sink.encode_batch(prepared, scored)
        except Exception as exc:
            if self._collective or not is_isolatable(exc):
                raise
            self._isolate(prepared.batch, exc)
            return
        self._publish(prepared, encoded)
        prepared.batch.checkpoint.seal()
        seconds = prepared.prepare_s + scored.forward_s + time.perf_counter() - start
        self._costs.append((prepared.batch.events.num_rows, seconds))

    def _isolate(self, batch: Batch, error: Exception) -> None:
        """Bisect the whole path on this thread: dead-letter the events that fail alone, score
        the rest, seal the checkpoint (single process)."""
        log.warning("batch of %d events failed (%s): isolating", batch.events.num_events, error)
        found = bisect(
            list(range(batch.events.num_events)), lambda g: self._run(_take(batch, g)), error
        )
        self._dead_letter(batch, found.failed)
        batch.checkpoint.seal()

    def _isolate_before_forward(self, batch: Batch, error: Exception) -> PreparedBatch | None:
        """Ranks of a sharded model: bisect the local steps before the forward, dead-letter the
        events that fail alone; the good ones join the agreed forward (``None``: none left)."""
        log.warning("batch of %d events failed (%s): isolating", batch.events.num_events, error)
        indices = list(range(batch.events.num_events))
        found = bisect(indices, lambda g: self._prepare(_take(batch, g)), error)
        self._dead_letter(batch, found.failed)
        good = found.good_items
        if good:
            return self._prepare(_take(batch, good))
        batch.checkpoint.seal()
        return None

    def _dead_letter(self, batch: Batch, failed: list[tuple[int, Exception]]) -> None:
        for index, exc in failed:
            rejection = RejectedMessage(
                RejectReason.PROCESSING_ERROR, f"{type(exc).__name__}: {exc}"
            )
            self._dead_letters.publish(batch.messages[index], rejection, batch.checkpoint)
            self._summary.dead_lettered += 1


def _take(batch: Batch, group: list[int]) -> Batch:
    return batch.take(np.asarray(group, dtype=np.int64))


def _unwrapped(attempt: Callable[[list[int]], None]) -> Callable[[list[int]], None]:
    """``attempt`` raising the forward's own error instead of :class:`ForwardFailed`."""

    def run(group: list[int]) -> None:
        try:
            attempt(group)
        except ForwardFailed as failed:
            raise failed.error from None

    return run
