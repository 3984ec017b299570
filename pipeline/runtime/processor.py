"""One batch's path after batching: enrich -> features -> forward -> top-K -> publish.

:class:`BatchProcessor` is the one place that runs these steps
(:class:`~pipeline.runtime.steps.BatchSteps`), in this order, for a closed batch and its
checkpoint; the loop (:mod:`pipeline.runtime.loop`) and its drain (:mod:`pipeline.runtime.drain`,
at the stop step and on a revocation) go through it.

- **prepare** (the loop's thread): enrich and featurise the batch; its model input starts on its
  way to the device.
- **score** (the scoring thread, :mod:`pipeline.stages.score`): one forward and the top-K.
  With ``overlap`` the forward of batch n runs while the loop consumes and prepares batch
  n+1; batches are always published in order, one forward in flight at most.
- **publish** (the loop's thread): one Recommendation per event; then the batch's checkpoint is
  sealed (the commit stage commits it once delivered).

A batch whose steps fail with an error that may come from its events is handed to poison
isolation (:mod:`pipeline.runtime.isolation`): the events that fail alone are dead-lettered with
``processing_error``, the rest are scored.
"""

from __future__ import annotations

import time

from model.serving import Scorer
from pipeline.observability.metrics import Metrics
from pipeline.observability.summary import RunSummary
from pipeline.runtime.isolation import PoisonIsolation, is_isolatable
from pipeline.runtime.stepping import IsolationRounds
from pipeline.runtime.steps import BatchSteps
from pipeline.stages.dead_letter import DeadLetterSink
from pipeline.stages.enrich.enricher import BatchEnricher
from pipeline.stages.features import FeatureStager
from pipeline.stages.publish import RecommendationSink
from pipeline.stages.score import ForwardExecutor, ForwardFailed
from pipeline.types import Batch, PreparedBatch, ScoredBatch

__all__ = ["BatchProcessor"]


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
        self._steps = BatchSteps(enricher, executor, sink, metrics, summary, features)
        self._executor = executor
        self._isolation = PoisonIsolation(self._steps, executor, dead_letters, summary)
        self._overlap = overlap
        self._collective = collective
        self._costs: list[tuple[int, float]] = []

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
                self._isolation.hold(failed.prepared.batch, failed.error)
            else:
                self._isolation.alone(failed.prepared.batch, failed.error)
            return
        if done is not None:
            self._publish_or_isolate(*done)

    @property
    def needs_isolation(self) -> bool:
        """Whether a batch of this rank waits to be bisected by all ranks together."""
        return self._isolation.waiting

    def isolate_together(self, rounds: IsolationRounds) -> None:
        """Every rank of a sharded model, in lockstep: publish the batch in flight (collective
        too), then bisect this rank's failed batches with every rank
        (:meth:`~pipeline.runtime.isolation.PoisonIsolation.together`).

        Args:
            rounds: agrees, per attempt, whether some rank still needs one and the rows to pad
                to (:meth:`pipeline.runtime.stepping.StepAgreement.agree_attempt`).
        """
        self.collect(wait=True)
        self._isolation.together(rounds)

    def discard(self) -> int:
        """Drop the batch in flight once its forward is done (a collective forward ends on
        every rank) and the batches waiting to be bisected, publishing nothing (their
        transaction was aborted: their events are consumed again).

        Returns:
            How many events were dropped.
        """
        try:
            done = self._executor.take(wait=True)
            dropped = done[0].batch.events.num_events if done is not None else 0
        except ForwardFailed as failed:
            dropped = failed.prepared.batch.events.num_events if failed.prepared else 0
        self._costs.clear()
        return dropped + self._isolation.drop()

    def process(self, batch: Batch) -> None:
        """The whole path for ``batch`` now, on this thread."""
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

    def _prepare_or_isolate(self, batch: Batch) -> PreparedBatch | None:
        """Enrich and featurise; when that fails for some events, what is left to score
        (``None``: nothing is left for the executor, or the batch was handled synchronously)."""
        try:
            return self._steps.prepare(batch)
        except Exception as exc:
            if not is_isolatable(exc):
                raise
            if not self._collective:
                self._isolation.alone(batch, exc)
                return None
            return self._isolation.before_forward(batch, exc)

    def _publish_or_isolate(self, prepared: PreparedBatch, scored: ScoredBatch) -> None:
        """Encode the batch (bisected when that fails for some events), then produce it and
        seal its checkpoint. A failure while producing is never retried here: the records
        already sent would be sent twice; it propagates and the batch stays uncommitted."""
        start = time.perf_counter()
        try:
            encoded = self._steps.encode(prepared, scored)
        except Exception as exc:
            if self._collective or not is_isolatable(exc):
                raise
            self._isolation.alone(prepared.batch, exc)
            return
        self._steps.publish(prepared, encoded)
        prepared.batch.checkpoint.seal()
        seconds = prepared.prepare_s + scored.forward_s + time.perf_counter() - start
        self._costs.append((prepared.batch.events.num_rows, seconds))
