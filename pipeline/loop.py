"""The scoring loop: it wires the stages and steps them; each stage does one job.

Follow one message through :meth:`ScoringPipeline.run`, in the order the data flows:

1. **source** (:mod:`pipeline.stages.source`): ``consume`` fills a bounded backlog.
2. **decode** (:mod:`pipeline.stages.decode`): bytes -> validated UserEvent; a rejected message
   goes to the dead-letter topic (:mod:`pipeline.stages.publish`) and the loop moves on.
3. **batch** (:mod:`pipeline.stages.batch`): the event joins the open micro-batch, which closes
   on rows or delay (:mod:`pipeline.stepping` decides when, agreed across ranks).
4. **enrich** (:mod:`pipeline.stages.enrich`): one Redis round trip for the batch.
5. **features** (:mod:`pipeline.stages.features`): numpy columns -> dense tensor + KJT.
6. **score** (:mod:`pipeline.stages.score`): one forward and the top-K of every event.
7. **publish** (:mod:`pipeline.stages.publish`): one Recommendation per event.
8. **commit** (:mod:`pipeline.stages.commit`): offsets are committed once every record they
   guard is acknowledged.

Rebalances are handled by :mod:`pipeline.stages.rebalance`; Kafka clients come from a
:data:`~pipeline.kafka_io.ClientFactory` (the real broker by default, fakes in unit tests).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from types import FrameType

from pipeline.config import Settings
from pipeline.delivery_settings import Guarantee
from pipeline.faults import FaultInjector
from pipeline.kafka_io import ClientFactory, connect
from pipeline.metrics import Metrics
from pipeline.stages.backpressure import BackpressuredProducer
from pipeline.stages.batch import MicroBatcher, Record, to_columns
from pipeline.stages.commit import Checkpoint, Checkpointer
from pipeline.stages.commit_transactional import TransactionalCheckpointer, transactional_kafka
from pipeline.stages.decode import (
    RECOMMENDATION_SCHEMA_FILE,
    RecordCodec,
    RejectedMessage,
    RejectReason,
    UserEventDecoder,
)
from pipeline.stages.enrich import BatchEnricher, FeatureEnricher
from pipeline.stages.features import build_feature_columns
from pipeline.stages.isolate import SOURCE_MESSAGE, bisect, is_isolatable
from pipeline.stages.publish import DeadLetterSink, RecommendationSink
from pipeline.stages.rebalance import Partition, RebalanceHandler
from pipeline.stages.score import ForwardExecutor, PreparedBatch, ScoredBatch, Scorer
from pipeline.stages.source import KafkaSource
from pipeline.stepping import LocalStepper, Stepper
from pipeline.summary import RunSummary

log = logging.getLogger(__name__)


@dataclass
class _Stages:
    """The stages that need the Kafka clients (built when a run starts)."""

    source: KafkaSource
    checkpointer: Checkpointer
    sink: RecommendationSink
    dead_letters: DeadLetterSink
    executor: ForwardExecutor
    rebalance: RebalanceHandler


class ScoringPipeline:
    """One consumer-group member scoring its partitions.

    Args:
        settings: the whole configuration.
        scorer: the model to serve.
        metrics: where to count (a fresh registry by default).
        enricher: an existing enricher (tests); built from ``settings.redis`` otherwise.
        stepper: when to score: :class:`~pipeline.stepping.LocalStepper` for one process,
            :class:`~pipeline.stepping.CollectiveStepper` for the ranks of a sharded model.
        clients: builds the Kafka clients (default :func:`pipeline.kafka_io.connect`).

    Example::

        pipeline = ScoringPipeline(load_settings(), Scorer.from_checkpoint(path))
        summary = pipeline.run(exit_when_idle_s=5)
    """

    def __init__(
        self,
        settings: Settings,
        scorer: Scorer,
        metrics: Metrics | None = None,
        enricher: BatchEnricher | None = None,
        stepper: Stepper | None = None,
        clients: ClientFactory = connect,
    ) -> None:
        self.settings = settings
        self.scorer = scorer
        self.metrics = metrics or Metrics()
        spec, batching = scorer.spec, settings.batching
        self.decoder = UserEventDecoder(settings.codec, recent_cap=spec.recent_items_cap)
        self.enricher: BatchEnricher = enricher or FeatureEnricher(
            settings.redis, spec.user_dense_dim, spec.item_dense_dim, self.metrics
        )
        self.batcher = MicroBatcher(batching.max_batch_rows, batching.max_delay_ms)
        self.stepper: Stepper = stepper or LocalStepper(self.metrics)
        self._collective = not isinstance(self.stepper, LocalStepper)
        overlap = batching.overlap_forward
        self._overlap = scorer.device.type == "cuda" if overlap is None else overlap
        self._clients = clients
        self._stages: _Stages | None = None
        self._stop = threading.Event()
        self._stop_by: float | None = None
        self.summary = RunSummary()
        self._faults = FaultInjector.from_env()  # TEST HOOK: None in production

    @property
    def assignment(self) -> set[Partition]:
        """Partitions this member owns now (empty before the run joins the group)."""
        return self._stages.source.assignment if self._stages else set()

    def stop(self) -> None:
        """Ask the loop to finish the open batch, commit, and return (thread/signal safe).

        Every wait from now on ends within ``shutdown.timeout_s``.
        """
        if not self._stop.is_set():
            self._stop_by = time.monotonic() + self.settings.shutdown.timeout_s
        self._stop.set()

    def stop_on_signals(self) -> None:
        """SIGTERM/SIGINT call :meth:`stop` (with several ranks: at the next agreed step)."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: finishing the open batch and committing", signum)
            self.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def run(
        self, exit_when_idle_s: float | None = None, max_events: int | None = None
    ) -> RunSummary:
        """Consume and score until stopped, idle for ``exit_when_idle_s``, or ``max_events`` in.

        Returns:
            The run's :class:`~pipeline.summary.RunSummary`.
        """
        st = self._stages = self._assemble()
        started = time.monotonic()
        try:
            self._loop(st, exit_when_idle_s, max_events)
            st.checkpointer.flush_and_commit(self.settings.shutdown.timeout_s)
        except BaseException:
            st.rebalance.failed = True  # closing must not score or commit more
            raise
        finally:
            self.summary.seconds = time.monotonic() - started
            self.summary.first_input_at = st.source.first_input_at
            self.metrics.set_up(False)
            st.source.close()
            st.executor.shutdown()
        return self.summary

    def _assemble(self) -> _Stages:
        settings, metrics = self.settings, self.metrics
        exactly_once = settings.delivery.guarantee is Guarantee.EXACTLY_ONCE
        kafka = transactional_kafka(settings) if exactly_once else settings.kafka
        clients = self._clients(kafka, settings.topics, metrics.record_librdkafka_stats)
        source = KafkaSource(
            clients.consumer, settings.topics.input, settings.batching.consume_batch_size
        )
        checkpointer: Checkpointer
        if exactly_once:
            checkpointer = TransactionalCheckpointer(
                clients.consumer,
                clients.producer,
                settings.delivery.commit_interval_ms / 1000,
                settings.batching.max_in_flight_batches,
            )
        else:
            checkpointer = Checkpointer(
                clients.consumer,
                clients.producer,
                settings.batching.max_in_flight_batches,
                commit_results=clients.commit_results,
            )
        codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, settings.topics.output)
        executor = ForwardExecutor(
            self.scorer,
            metrics,
            self._publish,
            self._overlap,
            self._collective,
            on_failed=self._isolate_failed,
            faults=self._faults,
        )
        rebalance = RebalanceHandler(
            source, self.batcher, checkpointer, executor, self._score_open_batch, self._collective
        )
        source.subscribe(rebalance.on_assign, rebalance.on_revoke, rebalance.on_lost)
        checkpointer.backpressure = source.held_back
        producer = BackpressuredProducer(clients.producer, source, lambda: self._stop_by)
        return _Stages(
            source=source,
            checkpointer=checkpointer,
            sink=RecommendationSink(producer, settings.topics.output, codec, metrics),
            dead_letters=DeadLetterSink(producer, settings.topics.dlq, metrics),
            executor=executor,
            rebalance=rebalance,
        )

    def _loop(self, st: _Stages, exit_when_idle_s: float | None, max_events: int | None) -> None:
        """One step per iteration: poll (when nothing is buffered), feed the batch, and ask the
        stepper whether to score now. Every rank runs the same number of iterations."""
        batcher, source = self.batcher, st.source
        poll_s = self.stepper.poll_timeout_s
        # Never wait longer than half the delay budget for a batch's first event, or past an
        # open batch's deadline.
        first_wait_s = min(poll_s, batcher.max_delay_s / 2)
        while True:
            if not source.backlog and not batcher.holding and not batcher.full:
                source.poll(min(poll_s, batcher.time_left() if len(batcher) else first_wait_s))
            self._feed(st)
            last = source.last_activity  # idle only counts once in the group
            idle = (
                exit_when_idle_s is not None
                and last is not None
                and not len(batcher)
                and not batcher.holding
                and not source.backlog
                and time.monotonic() - last >= exit_when_idle_s
            )
            stop_requested = self._stop.is_set() or (
                max_events is not None and self.summary.events_in >= max_events
            )
            if self._stop_by is not None:
                st.checkpointer.deadline = self._stop_by
            step = self.stepper.agree(batcher.ready(), batcher.rows, stop_requested, idle)
            if step.run or step.stop:
                self._score(st, batcher.close(), pad_rows=step.rows)
            elif not len(batcher):
                st.checkpointer.seal()  # offsets of dead-lettered messages alone
            st.executor.finish(wait=step.stop)
            st.checkpointer.commit_ready()
            if step.stop:
                if idle:
                    log.info("no input for %.1fs: stopping", exit_when_idle_s)
                return

    def _feed(self, st: _Stages) -> None:
        """Decode backlog messages into the open batch until it is full or the next event does
        not fit (the batcher holds that one for the next batch). Rejects go to the DLQ."""
        batcher, checkpointer, source = self.batcher, st.checkpointer, st.source
        start = time.perf_counter()
        held = batcher.admit_held()
        if held is not None:
            checkpointer.consumed(*held)
        if batcher.holding:
            return
        consumed = 0
        while not batcher.full and (message := source.next_message()) is not None:
            consumed += 1
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None
            try:
                record = self.decoder.decode(message.value())
            except RejectedMessage as rejection:
                checkpointer.consumed(topic, partition, offset)
                st.dead_letters.publish(message, rejection, checkpointer.open)
                self.summary.dead_lettered += 1
                continue
            record[SOURCE_MESSAGE] = message  # dead-lettered as is if it turns out poison
            if not batcher.fits(record):
                batcher.hold((topic, partition, offset), record)
                break
            checkpointer.consumed(topic, partition, offset)
            batcher.add(record, (topic, partition))
        if consumed:
            self.summary.events_in += consumed
            self.metrics.events_in.inc(consumed)
            self.metrics.stage_seconds.labels(stage="decode").observe(time.perf_counter() - start)

    def _score_open_batch(self) -> None:
        """Score and publish the open batch now (a single process handing partitions over)."""
        assert self._stages is not None
        self._score(self._stages, self.batcher.close())

    def _score(
        self, st: _Stages, records: list[Record] | None, pad_rows: int | None = None
    ) -> None:
        """Enrich and featurise one closed batch, then hand it to the forward executor.

        Args:
            st: the run's stages.
            records: the batch (``None``: nothing of ours to score).
            pad_rows: ranks of a sharded model pad to the agreed row count and run the forward
                even with no events of their own.
        """
        if not records:
            if self._collective and pad_rows:
                st.executor.submit_padding(pad_rows)
            return
        checkpoint = st.checkpointer.cut()  # what is consumed from now on is the next batch's
        try:
            prepared = self._prepare(records, checkpoint)
        except Exception as exc:
            if not is_isolatable(exc):
                raise
            self._isolate_prepare(st, records, checkpoint, exc, pad_rows)
            return
        st.executor.submit(prepared, pad_rows)

    def _prepare(self, records: list[Record], checkpoint: Checkpoint) -> PreparedBatch:
        """Enrich and featurise ``records`` (the steps before the forward)."""
        metrics = self.metrics
        with metrics.stage("enrich"):
            events = to_columns(records)
            enrichment = self.enricher.enrich(events.user_ids, events.candidate_ids)
        with metrics.stage("features"):
            if self._faults is not None:
                self._faults.check("features", events.event_ids)
            features = build_feature_columns(events, enrichment, self.scorer.spec)
            staged = self.scorer.stage(features)
        return PreparedBatch(events, enrichment, checkpoint, staged, records)

    def _isolate_prepare(
        self,
        st: _Stages,
        records: list[Record],
        checkpoint: Checkpoint,
        error: Exception,
        pad_rows: int | None,
    ) -> None:
        """A batch failed before its forward: dead-letter the events that fail alone.

        A single process scores the rest now. Ranks of a sharded model bisect only the local
        steps before the forward (no collective is involved), then join the agreed forward
        with the good events (or with padding when none is left): every rank still runs
        exactly one forward for the step.
        """
        log.warning("batch of %d events failed (%s): isolating", len(records), error)
        st.executor.finish()  # the previous batch is published first
        if not self._collective:
            self._isolate(st, records, checkpoint, error)
            return
        found = bisect(records, lambda group: self._prepare(group, checkpoint), error)
        self._dead_letter_failed(st, found.failed, checkpoint)
        good = found.good_records
        if good:
            st.executor.submit(self._prepare(good, checkpoint), pad_rows)
        else:
            st.checkpointer.seal(checkpoint)
            if pad_rows:
                st.executor.submit_padding(pad_rows)

    def _isolate_failed(self, batch: PreparedBatch, error: Exception) -> None:
        """The forward, top-K or publish of ``batch`` failed (single process): isolate."""
        assert self._stages is not None and batch.records is not None
        log.warning("batch of %d events failed (%s): isolating", len(batch.records), error)
        self._isolate(self._stages, batch.records, batch.checkpoint, error)

    def _isolate(
        self, st: _Stages, records: list[Record], checkpoint: Checkpoint, error: Exception
    ) -> None:
        """Bisect the whole chain synchronously (enrich to publish) on the loop's thread."""

        def process(group: list[Record]) -> None:
            batch = self._prepare(group, checkpoint)
            if self._faults is not None:
                self._faults.check("forward", batch.events.event_ids)
            probs = self.scorer.forward(batch.staged.ready_input())
            scored = self.scorer.top_k(probs, batch.events)
            latency_s = st.sink.publish(batch, scored, self.scorer.model_version)
            self.summary.record_batch(batch.events.num_events, batch.events.num_rows, latency_s)

        found = bisect(records, process, error)
        self._dead_letter_failed(st, found.failed, checkpoint)
        st.checkpointer.seal(checkpoint)

    def _dead_letter_failed(
        self, st: _Stages, failed: list[tuple[Record, Exception]], checkpoint: Checkpoint
    ) -> None:
        for record, exc in failed:
            rejection = RejectedMessage(
                RejectReason.PROCESSING_ERROR, f"{type(exc).__name__}: {exc}"
            )
            st.dead_letters.publish(record[SOURCE_MESSAGE], rejection, checkpoint)
            self.summary.dead_lettered += 1

    def _publish(self, batch: PreparedBatch, scored: ScoredBatch) -> None:
        """Produce a scored batch's Recommendations, then seal its checkpoint."""
        assert self._stages is not None
        with self.metrics.stage("produce"):
            latency_s = self._stages.sink.publish(batch, scored, self.scorer.model_version)
            self._stages.checkpointer.seal(batch.checkpoint)
        self.summary.record_batch(batch.events.num_events, batch.events.num_rows, latency_s)
