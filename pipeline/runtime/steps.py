"""The steps of one closed batch, in the order the data flows: enrich -> features -> forward ->
top-K -> publish.

:class:`BatchSteps` runs each step once for a batch; :class:`~pipeline.runtime.processor.
BatchProcessor` orders them across batches (one forward in flight, batches published in
order) and :mod:`pipeline.runtime.isolation` retries them on parts of a failed batch.

- **prepare**: one Redis round trip (:mod:`pipeline.stages.enrich.enricher`), the feature
  columns (:mod:`pipeline.stages.features`) and the model input on its way to the device
  (:meth:`model.serving.Scorer.stage`).
- **score**: one forward and the top-K (:mod:`pipeline.stages.score`; on the scoring thread
  when the processor starts it there).
- **encode, publish** (:mod:`pipeline.stages.publish`): one record per event (the
  Recommendation, or the user's output schema).
"""

from __future__ import annotations

import time

from model.serving import Scorer
from pipeline.observability.metrics import Metrics
from pipeline.observability.summary import RunSummary
from pipeline.stages.enrich.enricher import BatchEnricher
from pipeline.stages.features import BuiltinFeatures, FeatureStager
from pipeline.stages.publish import EncodedBatch, RecommendationSink
from pipeline.stages.score import ForwardExecutor, score_batch
from pipeline.types import Batch, PreparedBatch, ScoredBatch

__all__ = ["BatchSteps"]


class BatchSteps:
    """Enrich, featurise, score and publish one batch.

    Args:
        enricher: Redis features for a batch.
        executor: the scoring thread (holds the served model).
        sink: the output topic.
        metrics: stage timings.
        summary: the run's counts and latencies.
        features: lays out a batch's model input (default: the built-in model's features).

    Example::

        steps = BatchSteps(enricher, executor, sink, metrics, summary)
        steps.run(batch)  # the whole path on this thread
    """

    def __init__(
        self,
        enricher: BatchEnricher,
        executor: ForwardExecutor,
        sink: RecommendationSink,
        metrics: Metrics,
        summary: RunSummary,
        features: FeatureStager | None = None,
    ) -> None:
        self._enricher = enricher
        self._features = features or BuiltinFeatures()
        self._executor = executor
        self._sink = sink
        self._metrics = metrics
        self._summary = summary

    @property
    def scorer(self) -> Scorer:
        """The model that scores the next batch."""
        return self._executor.scorer

    def prepare(self, batch: Batch) -> PreparedBatch:
        """Enrich and featurise a batch; its model input starts on its way to the device."""
        start = time.perf_counter()
        events, metrics = batch.events, self._metrics
        with metrics.stage("enrich"):
            enrichment = self._enricher.enrich(events.user_ids, events.candidate_ids)
        with metrics.stage("features"):
            staged = self._features.stage(events, enrichment, self._executor.scorer)
        return PreparedBatch(batch, enrichment, staged, time.perf_counter() - start)

    def encode(self, prepared: PreparedBatch, scored: ScoredBatch) -> EncodedBatch:
        """The batch's records, encoded (an error here leaves nothing half-sent)."""
        return self._sink.encode_batch(prepared, scored)

    def publish(self, prepared: PreparedBatch, encoded: EncodedBatch) -> None:
        """Produce the batch's Recommendations (encoded: nothing can fail for an event now)."""
        with self._metrics.stage("produce"):
            latency_s = self._sink.send(prepared, encoded)
        events = prepared.batch.events
        self._summary.record_batch(events.num_events, events.num_rows, latency_s)

    def run(self, batch: Batch) -> None:
        """The whole path for ``batch`` on this thread, raising what fails (for bisection)."""
        prepared = self.prepare(batch)
        scored = score_batch(self._executor.scorer, prepared)
        self.publish(prepared, self.encode(prepared, scored))
