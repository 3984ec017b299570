"""The scoring loop of one consumer-group member: consume -> decode -> batch -> process -> commit.

Follow one message through :meth:`ScoringPipeline.run`, in the order the data flows:

1. **consume** (:mod:`pipeline.stages.source`): ``consume`` fills a bounded backlog.
2. **decode** (:mod:`pipeline.stages.decode`): a run of messages -> validated event columns,
   or a reject reason per message; each message is decoded once. Events without candidates
   get retrieved ones right away (:mod:`pipeline.runtime.retrieve`, with ``[retrieval]`` on).
3. **batch** (:mod:`pipeline.stages.batch`): the events that fit join the open micro-batch;
   the admitted messages' offsets join the open checkpoint (:mod:`pipeline.stages.commit`)
   and their rejects go to the dead-letter topic (:mod:`pipeline.stages.dead_letter`).
4. **decide**: the loop sums up its state in one :class:`~pipeline.runtime.stepping.LocalStep`
   (is the batch ready, by the batch policy of :mod:`pipeline.runtime.batch_policy`: as soon as
   the scorer is free, within a latency budget; was a stop requested; is the member idle; its
   model swap offer) and its stepper turns it into one
   :class:`~pipeline.runtime.stepping.StepDecision` (:mod:`pipeline.runtime.stepping`: alone,
   or agreed across ranks), which the rest of the iteration acts on.
5. **process** (:class:`~pipeline.runtime.processor.BatchProcessor`): enrich -> features ->
   forward -> top-K -> publish for the closed batch and the checkpoint cut for it.
6. **commit** (:mod:`pipeline.stages.commit`): offsets are committed once every record they
   guard is acknowledged.

The loop is the one owner of "finish, publish, commit": its :class:`~pipeline.runtime.drain.Drain`
ends the open work at the stop step, and, called by the rebalance handler
(:mod:`pipeline.runtime.rebalance`) from inside ``poll()``, for partitions being revoked. One
:class:`~pipeline.runtime.pausing.InputPause` is the one owner of pausing the input.

Between two steps the served model version may change (:mod:`pipeline.runtime.model_swap`:
agreed in the step, carried out here when nothing decoded waits for a batch and no forward is in
flight). Kafka clients come from a :data:`~pipeline.connectors.kafka.clients.ClientFactory` (the
real broker by default, fakes in unit tests). Nothing below calls back into this module.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from model.rank import RankContext
from model.serving import Scorer
from pipeline.connectors.avro.reference import RecordCodec
from pipeline.connectors.kafka.clients import ClientFactory, connect
from pipeline.models.inputs import serving_inputs
from pipeline.models.output import OutputContract, resolve_output
from pipeline.observability.metrics import Metrics
from pipeline.observability.summary import RunSummary
from pipeline.runtime.backpressure import BackpressuredProducer
from pipeline.runtime.batch_policy import BatchPolicy
from pipeline.runtime.drain import Drain
from pipeline.runtime.idle import IdleClock
from pipeline.runtime.model_swap import ModelSwap
from pipeline.runtime.pausing import InputPause
from pipeline.runtime.processor import BatchProcessor
from pipeline.runtime.rebalance import RebalanceHandler
from pipeline.runtime.retrieve import CandidateRetriever
from pipeline.runtime.stepping import NO_SWAP, LocalStep, StepAgreement, StepDecision, Stepper
from pipeline.settings.delivery import Guarantee
from pipeline.settings.loading import Settings
from pipeline.stages.batch import MicroBatcher
from pipeline.stages.commit import (
    Checkpointer,
    TransactionFailed,
    make_checkpointer,
    transactional_kafka,
)
from pipeline.stages.dead_letter import DeadLetterSink
from pipeline.stages.enrich.enricher import BatchEnricher
from pipeline.stages.publish import RecommendationSink
from pipeline.stages.score import ForwardExecutor
from pipeline.stages.source import KafkaSource
from pipeline.types import Batch, Shutdown

if TYPE_CHECKING:
    from model.features.mapping import FeatureMap
    from model.retrieval.index import VectorIndex

log = logging.getLogger(__name__)


@dataclass
class _Run:
    """What needs the Kafka clients (built when a run starts)."""

    source: KafkaSource
    dead_letters: DeadLetterSink
    checkpointer: Checkpointer
    processor: BatchProcessor
    drain: Drain


class ScoringPipeline:
    """One consumer-group member scoring its partitions.

    Args:
        settings: the whole configuration.
        scorer: the model to serve (:class:`~model.serving.ScorerFactory` builds it).
        metrics: where to count (a fresh registry by default).
        enricher: the feature source; built from ``settings.redis`` by default.
        stepper: when to score (:class:`~pipeline.runtime.stepping.StepAgreement`: alone by
            default, over a process group for the ranks of a sharded model).
        clients: builds the Kafka clients (default
        :func:`pipeline.connectors.kafka.clients.connect`).
        rank: this process's place in the job (the transactional id of exactly-once).
        index: the served version's retrieval index (``None``: events without candidates
            are dead-lettered, ``no_candidates``).
        models: follows a versions directory and swaps new versions in
            (:class:`~pipeline.runtime.model_swap.ModelSwap`); ``None``: the model never changes.
        feature_map: a configured model's feature map, resolved by the model loader
            (default: resolved here from ``settings``).
        output: the output contract, resolved once for this process: a configured model's by
            the model loader, the built-in model's by ``run``'s start-up checks (default:
            resolved here from ``settings``).

    Example::

        scorer = ScorerFactory(serving_options(settings)).create_scorer()
        summary = ScoringPipeline(load_settings(), scorer).run(exit_when_idle_s=5)
    """

    def __init__(
        self,
        settings: Settings,
        scorer: Scorer,
        metrics: Metrics | None = None,
        enricher: BatchEnricher | None = None,
        stepper: Stepper | None = None,
        clients: ClientFactory = connect,
        rank: RankContext | None = None,
        index: VectorIndex | None = None,
        models: ModelSwap | None = None,
        feature_map: FeatureMap | None = None,
        output: OutputContract | None = None,
    ) -> None:
        self.settings = settings
        self.scorer = scorer
        self.metrics = metrics or Metrics()
        self.rank = rank or RankContext()
        self.models = models
        # the settings first: batching, the stop's deadline
        batching = settings.batching
        self.batcher = MicroBatcher(batching.max_batch_rows, batching.max_delay_ms)
        self.policy = BatchPolicy(batching.max_delay_ms, batching.latency_budget_ms)
        overlap = batching.overlap_forward
        self.overlap = scorer.device.type == "cuda" if overlap is None else overlap
        self.shutdown = Shutdown(settings.shutdown.timeout_s)
        self.stepper: Stepper = stepper or StepAgreement(metrics=self.metrics)
        self.collective = self.stepper.collective
        # then the model's input and output: decode, enrich, features (the built-in model's,
        # or those of [model.module]'s map) and [output], as the loader (or run's checks)
        # resolved them, else resolved here
        inputs = serving_inputs(
            settings, self.metrics, scorer.spec if scorer.builtin else None, enricher, feature_map
        )
        self.decoder = inputs.decoder
        self.enricher: BatchEnricher = inputs.enricher
        self.features = inputs.features
        self.output = output or resolve_output(settings, inputs.feature_map)
        # each index retrieves the num_candidates of the config it was built with
        self.retriever = CandidateRetriever(index, metrics=self.metrics, enricher=inputs.enricher)
        self.summary = RunSummary()
        self._clients = clients
        self._run: _Run | None = None
        self._taken = 0
        self._rewinding = False
        """A transaction failed: the next step rewinds (exactly-once)."""
        self._idle = IdleClock()

    @property
    def assignment(self) -> set[tuple[str, int]]:
        """Partitions this member owns now (empty before the run joins the group)."""
        return self._run.source.assignment if self._run else set()

    def stop(self) -> None:
        """Ask the loop to finish the open batch, commit, and return (thread/signal safe).

        Every wait from now on ends within ``shutdown.timeout_s``.
        """
        self.shutdown.request()

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
        """Consume and score until stopped, idle for ``exit_when_idle_s``, or ``max_events``
        messages consumed (never more: the rest stay uncommitted for the next run).

        Returns:
            The run's :class:`~pipeline.observability.summary.RunSummary`.
        """
        run = self._run = self._start()
        started = time.monotonic()
        if self.models is not None:
            self.models.start()
        try:
            self._loop(run, exit_when_idle_s, max_events)
            run.drain.commit()
        except BaseException:
            run.drain.closing = True  # closing must not score or commit more
            raise
        finally:
            self.summary.seconds = time.monotonic() - started
            self.summary.first_input_at = run.source.first_input_at
            self.metrics.set_up(False)
            if self.models is not None:
                self.models.stop()
            run.source.close()
            run.processor.close()
        return self.summary

    def _start(self) -> _Run:
        """Connect, and build the stages that need the clients, in data-flow order."""
        settings, metrics = self.settings, self.metrics
        exactly_once = settings.delivery.guarantee is Guarantee.EXACTLY_ONCE
        kafka = transactional_kafka(settings, self.rank) if exactly_once else settings.kafka
        config = kafka.config  # the clients and the commit protocol's budget are made of it
        clients = self._clients(config, settings.topics, metrics.record_librdkafka_stats)
        source = KafkaSource(
            clients.consumer, settings.topics.input, settings.batching.consume_batch_size
        )
        pause = InputPause(source)
        producer = BackpressuredProducer(clients.producer, pause, self.shutdown)
        dead_letters = DeadLetterSink(producer, settings.topics.dlq, metrics)
        codec = RecordCodec(settings.codec, self.output.schema_file, settings.topics.output)
        program = self.output.program
        processor = BatchProcessor(
            self.enricher,
            ForwardExecutor(self.scorer, metrics, self.settings.batching.warm_up_rows),
            RecommendationSink(producer, settings.topics.output, codec.header, metrics, program),
            dead_letters,
            metrics,
            self.summary,
            overlap=self.overlap,
            collective=self.collective,
            features=self.features,
        )
        checkpointer = make_checkpointer(
            settings.delivery,
            clients,
            settings.batching.max_in_flight_batches,
            self.shutdown,
            config,
        )
        metrics.commit_failures.watch(lambda: checkpointer.commit_failures)
        drain = Drain(
            self.batcher,
            checkpointer,
            processor,
            source,
            producer,
            pause,
            self.stepper,
            self.shutdown,
        )
        rebalance = RebalanceHandler(source, drain)
        source.subscribe(rebalance.on_assign, rebalance.on_revoke, rebalance.on_lost)
        return _Run(source, dead_letters, checkpointer, processor, drain)

    def _loop(self, run: _Run, exit_when_idle_s: float | None, max_events: int | None) -> None:
        """One step per iteration: this member's step state, one agreed decision, acted on in
        data-flow order. Every rank runs the same number of iterations."""
        batcher, checkpointer, processor = self.batcher, run.checkpointer, run.processor
        while True:
            try:
                # consume: what is queued at once; block only while there is nothing to do
                if not self._has_work(run.source):
                    run.source.poll(self._poll_wait_s(run.source, processor.busy))
                # decode -> batch (nothing new while a failed transaction waits to be aborted)
                if not self._rewinding:
                    self._fill_batch(run, max_events)
            except TransactionFailed:  # raised in a rebalance callback, or by a dead letter
                self._rewinding = True
            # when to score (agreed across ranks)
            local = self._local_step(run, exit_when_idle_s, max_events)
            step = self.stepper.agree(local)
            if step.rewind:  # a transaction failed, here or on another rank: all go back
                run.drain.rewind()
                self._rewinding = False
                self._idle.busy()
                continue
            try:
                # process
                if step.isolate:  # a rank's batch failed after the collective forward
                    processor.isolate_together(self.stepper)
                if step.run or step.stop:
                    self.policy.closed(batcher.rows, batcher.oldest, time.monotonic())
                if step.stop:
                    run.drain.finish(step.rows)  # the open batch and the one in flight
                elif step.run:
                    closed = batcher.close()
                    batch = Batch(*closed, checkpointer.cut()) if closed is not None else None
                    processor.submit(batch, pad_rows=step.rows)
                elif not len(batcher):
                    checkpointer.seal_open()  # offsets of dead-lettered messages alone
                processor.collect(wait=False)
                for rows, seconds in processor.take_costs():
                    self.policy.observe(rows, seconds, time.monotonic())
                if self.models is not None and not step.stop:
                    self._follow_models(run, step)
                # commit
                checkpointer.commit_ready()
            except TransactionFailed:  # aborted and rewound at the next step
                self._rewinding = True
            if step.stop:
                self._isolate_last(run, local.idle)
                if local.idle:
                    log.info("no input for %.1fs: stopping", exit_when_idle_s)
                return

    def _has_work(self, source: KafkaSource) -> bool:
        """Whether polled, decoded or batched events wait (then the poll does not block)."""
        batcher = self.batcher
        return bool(source.backlog or batcher.waiting or batcher.is_complete or batcher.full)

    def _poll_wait_s(self, source: KafkaSource, busy: bool) -> float:
        """How long the poll may block: the stepper's poll timeout, or less when the open
        batch is due sooner (the batch policy)."""
        batcher = self.batcher
        now = time.monotonic()
        _, wait_s = self.policy.decide(batcher.rows, batcher.oldest, now, not busy, source.drained)
        return min(self.stepper.poll_timeout_s, wait_s)

    def _local_step(
        self, run: _Run, exit_when_idle_s: float | None, max_events: int | None
    ) -> LocalStep:
        """This member's step state, from the batcher, the source, the batch policy, the stop
        request, its idleness and the model swap."""
        batcher, source, processor = self.batcher, run.source, run.processor
        drained = source.drained and not source.backlog and not batcher.waiting
        score_now, _ = self.policy.decide(
            batcher.rows, batcher.oldest, time.monotonic(), not processor.busy, drained
        )
        holding = self.models is not None and self.models.holding
        ready = batcher.full or batcher.is_complete or score_now
        ready = ready or (holding and len(batcher) > 0)  # a swap waits for it
        stop_requested = self.shutdown.requested or (
            max_events is not None and self.summary.events_in >= max_events
        )
        return LocalStep(
            ready=ready,
            rows=batcher.rows,
            stop_requested=stop_requested,
            idle=self._idle.idle(
                bool(len(batcher) or batcher.waiting or source.backlog),
                source.last_activity,
                exit_when_idle_s,
            ),
            isolate=processor.needs_isolation,
            offer=self.models.offer(not batcher.waiting) if self.models else NO_SWAP,
            rewind=self._rewinding,
        )

    def _follow_models(self, run: _Run, step: StepDecision) -> None:
        """After a step: the agreed model version, once it is swapped in, scores the next
        batch and its index retrieves the next events' candidates
        (:meth:`~pipeline.runtime.model_swap.ModelSwap.follow`)."""
        assert self.models is not None
        served = self.models.follow(step, run.processor, self.stepper, self.collective)
        if served is not None:
            self.scorer = served.scorer
            self.retriever.index = served.index

    def _isolate_last(self, run: _Run, idle: bool) -> None:
        """One last agreement: a batch that failed in the stop step is bisected by every rank
        before they leave (a single process has bisected it already)."""
        last = LocalStep(False, 0, True, idle, isolate=run.processor.needs_isolation)
        if self.stepper.agree(last).isolate:
            run.processor.isolate_together(self.stepper)
            run.checkpointer.commit_ready()

    def _fill_batch(self, run: _Run, max_events: int | None) -> None:
        """Decode polled messages and admit what fits into the open batch: their offsets join
        the open checkpoint, their rejects go to the dead-letter topic."""
        batcher, source, checkpointer = self.batcher, run.source, run.checkpointer
        while True:
            admitted = batcher.admit(self.policy.row_cap(batcher.oldest, time.monotonic()))
            if admitted is not None:
                checkpointer.consumed(admitted.topic, admitted.partitions, admitted.offsets)
                for index, rejection in admitted.rejections:
                    message = admitted.messages.message(index)
                    run.dead_letters.publish(message, rejection, checkpointer.open)
                self.summary.dead_lettered += len(admitted.rejections)
                self.summary.events_in += len(admitted)
                self.metrics.events_in.inc(len(admitted))
                continue
            limit = self.settings.batching.consume_batch_size
            if max_events is not None:
                limit = min(limit, max_events - self._taken)
            holding = self.models is not None and self.models.holding
            if batcher.is_complete or batcher.full or limit <= 0 or holding:
                return
            arrived = source.head_arrival
            messages = source.take(limit)
            if not len(messages):
                return
            self._taken += len(messages)
            with self.metrics.stage("decode"):
                decoded = self.decoder.decode(messages)
            batcher.queue(self.retriever.fill(decoded), arrived)
