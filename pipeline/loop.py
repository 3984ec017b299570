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
from pipeline.stages.batch import EventColumns, MicroBatcher
from pipeline.stages.columnar import ColumnarDecoder
from pipeline.stages.commit import Checkpoint, Checkpointer
from pipeline.stages.commit_transactional import TransactionalCheckpointer, transactional_kafka
from pipeline.stages.decode import RECOMMENDATION_SCHEMA_FILE, RecordCodec
from pipeline.stages.enrich import BatchEnricher, FeatureEnricher
from pipeline.stages.features import build_feature_columns
from pipeline.stages.intake import Intake
from pipeline.stages.isolate import is_isolatable
from pipeline.stages.poison import PoisonIsolator
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
    intake: Intake
    poison: PoisonIsolator


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
        self.decoder = ColumnarDecoder(settings.codec, recent_cap=spec.recent_items_cap)
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
        metrics.commit_failures.watch(lambda: checkpointer.commit_failures)
        codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, settings.topics.output)
        executor = ForwardExecutor(
            self.scorer,
            metrics,
            self._publish,
            self._overlap,
            self._collective,
            on_failed=self._isolate_failed_forward,
            faults=self._faults,
        )
        rebalance = RebalanceHandler(
            source, self.batcher, checkpointer, executor, self._score_open_batch, self._collective
        )
        source.subscribe(rebalance.on_assign, rebalance.on_revoke, rebalance.on_lost)
        checkpointer.backpressure = source.held_back
        producer = BackpressuredProducer(clients.producer, source, lambda: self._stop_by)
        dead_letters = DeadLetterSink(producer, settings.topics.dlq, metrics)
        return _Stages(
            source=source,
            checkpointer=checkpointer,
            sink=RecommendationSink(producer, settings.topics.output, codec, metrics),
            dead_letters=dead_letters,
            executor=executor,
            rebalance=rebalance,
            intake=Intake(
                source,
                self.decoder,
                self.batcher,
                checkpointer,
                dead_letters,
                settings.batching.consume_batch_size,
                self._count_dead_letter,
            ),
            poison=PoisonIsolator(
                self._prepare,
                self._process,
                dead_letters,
                checkpointer,
                executor,
                self._collective,
                self._count_dead_letter,
            ),
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
        """Source -> decode -> batch (:class:`~pipeline.stages.intake.Intake`)."""
        start = time.perf_counter()
        consumed = st.intake.feed()
        if consumed:
            self.summary.events_in += consumed
            self.metrics.events_in.inc(consumed)
            self.metrics.stage_seconds.labels(stage="decode").observe(time.perf_counter() - start)

    def _count_dead_letter(self) -> None:
        self.summary.dead_lettered += 1

    def _score_open_batch(self) -> None:
        """Score and publish the open batch now (a single process handing partitions over)."""
        assert self._stages is not None
        self._score(self._stages, self.batcher.close())

    def _score(self, st: _Stages, events: EventColumns | None, pad_rows: int | None = None) -> None:
        """Enrich and featurise one closed batch, then hand it to the forward executor.

        Args:
            st: the run's stages.
            events: the batch (``None``: nothing of ours to score).
            pad_rows: ranks of a sharded model pad to the agreed row count and run the forward
                even with no events of their own.
        """
        if events is None:
            if self._collective and pad_rows:
                st.executor.submit_padding(pad_rows)
            return
        checkpoint = st.checkpointer.cut()  # what is consumed from now on is the next batch's
        try:
            prepared = self._prepare(events, checkpoint)
        except Exception as exc:
            if not is_isolatable(exc):
                raise
            st.poison.before_forward(events, checkpoint, exc, pad_rows)
            return
        st.executor.submit(prepared, pad_rows)

    def _prepare(self, events: EventColumns, checkpoint: Checkpoint) -> PreparedBatch:
        """Enrich and featurise ``events`` (the steps before the forward)."""
        metrics = self.metrics
        with metrics.stage("enrich"):
            enrichment = self.enricher.enrich(events.user_ids, events.candidate_ids)
        with metrics.stage("features"):
            if self._faults is not None:
                self._faults.check("features", events.event_ids)
            features = build_feature_columns(events, enrichment, self.scorer.spec)
            staged = self.scorer.stage(features)
        return PreparedBatch(events, enrichment, checkpoint, staged)

    def _process(self, events: EventColumns, checkpoint: Checkpoint) -> None:
        """The whole chain for ``events``, synchronously (poison isolation bisects this)."""
        assert self._stages is not None
        batch = self._prepare(events, checkpoint)
        if self._faults is not None:
            self._faults.check("forward", events.event_ids)
        scored = self.scorer.top_k(self.scorer.forward(batch.staged.ready_input()), events)
        latency_s = self._stages.sink.publish(batch, scored, self.scorer.model_version)
        self.summary.record_batch(events.num_events, events.num_rows, latency_s)

    def _isolate_failed_forward(self, batch: PreparedBatch, error: Exception) -> None:
        assert self._stages is not None
        self._stages.poison.after_forward(batch, error)

    def _publish(self, batch: PreparedBatch, scored: ScoredBatch) -> None:
        """Produce a scored batch's Recommendations, then seal its checkpoint."""
        assert self._stages is not None
        with self.metrics.stage("produce"):
            latency_s = self._stages.sink.publish(batch, scored, self.scorer.model_version)
            self._stages.checkpointer.seal(batch.checkpoint)
        self.summary.record_batch(batch.events.num_events, batch.events.num_rows, latency_s)
