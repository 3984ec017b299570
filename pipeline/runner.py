"""The scoring loop: source -> codec -> batch -> enrich -> features -> score -> sink -> commit.

Follow one message through :meth:`ScoringPipeline.run`:

1. **source**: ``consumer.consume`` returns up to ``batching.consume_batch_size`` messages.
2. **codec**: :class:`~pipeline.codec.UserEventDecoder` decodes and validates; a rejected message
   goes to the dead-letter topic (:mod:`pipeline.dead_letter`) and the loop moves on.
3. **batch**: valid events join the open micro-batch (:mod:`pipeline.batch`), which closes on
   rows or delay.
4. **enrich**: one Redis round trip for the batch's users and items (:mod:`pipeline.enrich`).
5. **features**: numpy columns -> dense tensor + KeyedJaggedTensor (:mod:`pipeline.features`,
   :mod:`model.features`).
6. **score**: one forward, top-K per event (:mod:`pipeline.score`).
7. **sink**: one Recommendation per event (:mod:`pipeline.sink`).
8. **commit**: offsets are committed once every record of the batch is acknowledged
   (:mod:`pipeline.checkpointing`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from model.features import ModelInput
from pipeline.batch import EventColumns, MicroBatcher, to_columns
from pipeline.checkpointing import Checkpoint, Checkpointer
from pipeline.codec import (
    RECOMMENDATION_SCHEMA_FILE,
    Record,
    RecordCodec,
    RejectedMessage,
    UserEventDecoder,
)
from pipeline.config import Settings
from pipeline.dead_letter import DeadLetterSink
from pipeline.enrich import Enrichment, FallbackFeature, FeatureEnricher
from pipeline.features import build_feature_columns, fallback_flags
from pipeline.kafka_io import ensure_topics, make_consumer, make_producer
from pipeline.metrics import Metrics
from pipeline.score import ScoredBatch, Scorer
from pipeline.sink import RecommendationSink
from pipeline.stepping import LocalStepper, Stepper

log = logging.getLogger(__name__)

_POLL_TIMEOUT_S = 0.1
_MAX_LATENCY_SAMPLES = 1_000_000


@dataclass
class RunSummary:
    """What one run did (printed by ``streamrank run`` and the demo)."""

    events_in: int = 0
    events_out: int = 0
    dead_lettered: int = 0
    rows_scored: int = 0
    batches: int = 0
    seconds: float = 0.0
    first_input_at: float | None = None
    last_output_at: float | None = None
    latencies_s: list[float] = field(default_factory=list)

    @property
    def busy_seconds(self) -> float:
        """From the first message consumed to the last batch produced (idle time excluded)."""
        if self.first_input_at is None or self.last_output_at is None:
            return 0.0
        return self.last_output_at - self.first_input_at

    @property
    def events_per_s(self) -> float:
        return self.events_out / self.busy_seconds if self.busy_seconds else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows_scored / self.busy_seconds if self.busy_seconds else 0.0

    def latency_quantile(self, q: float) -> float:
        return float(np.quantile(self.latencies_s, q)) if self.latencies_s else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {
            "events_in": self.events_in,
            "events_out": self.events_out,
            "dead_lettered": self.dead_lettered,
            "rows_scored": self.rows_scored,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "busy_seconds": round(self.busy_seconds, 3),
            "events_per_s": round(self.events_per_s, 1),
            "rows_per_s": round(self.rows_per_s, 1),
            "latency_p50_ms": round(self.latency_quantile(0.5) * 1000, 2),
            "latency_p99_ms": round(self.latency_quantile(0.99) * 1000, 2),
        }


@dataclass
class _InFlight:
    """A batch whose forward runs on the scoring thread (padding-only steps have no events)."""

    events: EventColumns | None
    enrichment: Enrichment | None
    checkpoint: Checkpoint | None
    future: Future[Any]


class ScoringPipeline:
    """One consumer-group member scoring its partitions.

    Args:
        settings: the whole configuration.
        scorer: the model to serve.
        metrics: where to count (a fresh registry by default).
        enricher: an existing enricher (tests); built from ``settings.redis`` otherwise.
        stepper: when to score; :class:`~pipeline.stepping.LocalStepper` for one process,
            :class:`~pipeline.stepping.CollectiveStepper` for the ranks of a sharded model.

    Example::

        pipeline = ScoringPipeline(load_settings(), Scorer.from_checkpoint(path))
        summary = pipeline.run(exit_when_idle_s=5)
    """

    def __init__(
        self,
        settings: Settings,
        scorer: Scorer,
        metrics: Metrics | None = None,
        enricher: FeatureEnricher | None = None,
        stepper: Stepper | None = None,
    ) -> None:
        self.settings = settings
        self.scorer = scorer
        self.metrics = metrics or Metrics()
        spec = scorer.spec
        self.decoder = UserEventDecoder(settings.codec, recent_cap=spec.recent_items_cap)
        self.enricher = enricher or FeatureEnricher(
            settings.redis, spec.user_dense_dim, spec.item_dense_dim, self.metrics
        )
        self.batcher = MicroBatcher(
            settings.batching.max_batch_rows, settings.batching.max_delay_ms
        )
        self.stepper: Stepper = stepper or LocalStepper()
        self._collective = not isinstance(self.stepper, LocalStepper)
        self._backlog: deque[Message] = deque()
        """Polled messages not yet fed to the batcher (never registered with the checkpointer)."""
        self._held: tuple[tuple[str, int, int], Record] | None = None
        """A decoded event that did not fit the open batch: first of the next one."""
        self.assignment: set[tuple[str, int]] = set()
        """Partitions this member owns now (updated by the rebalance callbacks)."""
        self._stop = threading.Event()
        self._failed = False
        self._forward_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
        """Runs each batch's forward (while the loop consumes the next batch if overlapping)."""
        overlap = settings.batching.overlap_forward
        self._overlap = scorer.device.type == "cuda" if overlap is None else overlap
        self._inflight: _InFlight | None = None
        self._last_activity: float | None = None
        """Last input or (re)assignment; None until the group first assigned partitions."""
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._checkpointer: Checkpointer | None = None
        self._sink: RecommendationSink | None = None
        self._dead_letters: DeadLetterSink | None = None
        self.summary = RunSummary()

    def stop(self) -> None:
        """Ask the loop to finish the open batch, commit, and return (thread/signal safe)."""
        self._stop.set()

    def stop_on_signals(self) -> None:
        """SIGTERM/SIGINT call :meth:`stop` (with several ranks: at the next agreed step)."""

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: finishing the open batch and committing", signum)
            self.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    # -- the loop ------------------------------------------------------------------------------

    def run(
        self, exit_when_idle_s: float | None = None, max_events: int | None = None
    ) -> RunSummary:
        """Consume and score until stopped, idle for ``exit_when_idle_s``, or ``max_events`` in.

        Returns:
            The run's :class:`RunSummary`.
        """
        settings = self.settings
        ensure_topics(settings.kafka, settings.topics)
        self._producer = producer = make_producer(settings.kafka)
        self._consumer = consumer = make_consumer(
            settings.kafka, stats_cb=self.metrics.record_librdkafka_stats
        )
        self._checkpointer = checkpointer = Checkpointer(
            consumer, producer, max_sealed=settings.batching.max_in_flight_batches
        )
        codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, settings.topics.output)
        self._sink = RecommendationSink(
            producer, settings.topics.output, codec, checkpointer, self.metrics
        )
        self._dead_letters = DeadLetterSink(
            producer, settings.topics.dlq, checkpointer, self.metrics
        )
        consumer.subscribe(
            [settings.topics.input],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        started = time.monotonic()
        try:
            self._loop(exit_when_idle_s, max_events)
            checkpointer.flush_and_commit()
        except BaseException:
            # Leave uncommitted work to the next run; closing must not score or commit more.
            self._failed = True
            raise
        finally:
            self.summary.seconds = time.monotonic() - started
            consumer.close()
            self._forward_pool.shutdown(wait=True)
        return self.summary

    def _loop(self, exit_when_idle_s: float | None, max_events: int | None) -> None:
        """One step per iteration: poll (when nothing is buffered), feed the batcher, and ask
        the stepper whether to score now. Every rank runs the same number of iterations."""
        consumer, checkpointer = self._consumer, self._checkpointer
        assert consumer is not None and checkpointer is not None
        batcher, summary = self.batcher, self.summary
        batch_size = self.settings.batching.consume_batch_size
        poll_s = self.stepper.poll_timeout_s
        # consume(n, timeout) returns after n messages or the timeout: never wait longer than
        # half the delay budget for the first event of a batch, or past an open batch's deadline.
        first_wait_s = min(poll_s, batcher.max_delay_s / 2)
        while True:
            if not self._backlog and self._held is None and not batcher.full:
                wait = batcher.time_left() if len(batcher) else first_wait_s
                messages = consumer.consume(batch_size, min(poll_s, wait))
                if messages:
                    now = time.monotonic()
                    self._last_activity = now
                    if summary.first_input_at is None:
                        summary.first_input_at = now
                    self._backlog.extend(messages)
            self._feed()
            now = time.monotonic()
            idle = (
                exit_when_idle_s is not None
                and self._last_activity is not None  # idle only counts once in the group
                and not len(batcher)
                and self._held is None
                and not self._backlog
                and now - self._last_activity >= exit_when_idle_s
            )
            stop_requested = self._stop.is_set() or (
                max_events is not None and summary.events_in >= max_events
            )
            ready = batcher.full or self._held is not None or batcher.due(now)
            step = self.stepper.agree(ready, batcher.rows, stop_requested, idle)
            if step.run or step.stop:
                self._score(batcher.close(), pad_rows=step.rows)
            elif not len(batcher):
                checkpointer.seal()  # offsets of dead-lettered messages alone
            self._finish_inflight(wait=step.stop)
            checkpointer.commit_ready()
            if step.stop:
                if idle:
                    log.info("no input for %.1fs: stopping", exit_when_idle_s)
                return

    def _feed(self) -> None:
        """Move buffered messages into the open batch until it is full or the next event
        does not fit (that one is held for the next batch). Rejects go to the DLQ."""
        checkpointer = self._checkpointer
        dead_letters = self._dead_letters
        assert checkpointer is not None and dead_letters is not None
        batcher, backlog, summary = self.batcher, self._backlog, self.summary
        start = time.perf_counter()
        if self._held is not None:
            if not batcher.fits(self._held[1]):
                return
            (held_topic, held_partition, held_offset), held_record = self._held
            self._held = None
            checkpointer.consumed(held_topic, held_partition, held_offset)
            batcher.add(held_record, (held_topic, held_partition))
        decode = self.decoder.decode
        consumed = 0
        while backlog and not batcher.full:
            msg = backlog.popleft()
            err = msg.error()
            if err is not None:
                self._client_error(err)
                continue
            consumed += 1
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            assert topic is not None and partition is not None and offset is not None
            try:
                record = decode(msg.value())
            except RejectedMessage as rejection:
                checkpointer.consumed(topic, partition, offset)
                dead_letters.publish(msg, rejection)
                summary.dead_lettered += 1
                continue
            if not batcher.fits(record):
                self._held = ((topic, partition, offset), record)
                break
            checkpointer.consumed(topic, partition, offset)
            batcher.add(record, (topic, partition))
        if consumed:
            summary.events_in += consumed
            self.metrics.events_in.inc(consumed)
            self.metrics.stage_seconds.labels(stage="decode").observe(time.perf_counter() - start)

    def _client_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if err.fatal():
            raise KafkaException(err)
        log.warning("consumer error: %s", err)

    def _score(self, records: list[Record] | None, pad_rows: int | None = None) -> None:
        """Enrich and featurise one closed batch, then run its forward on the scoring thread.

        With ``batching.overlap_forward`` the forward of this batch overlaps with consuming and
        decoding the next one; the previous batch's forward is finished (and its results
        published) first, so one forward at most is in flight and batches are published in
        order. Without it, the batch is published before this returns.

        Args:
            records: the batch (``None``/empty: nothing of ours to score).
            pad_rows: ranks of a sharded model pad to the agreed row count and run the forward
                even with no events of their own; ``None`` for a single process.
        """
        if not records:
            if self._collective and pad_rows:
                self._finish_inflight()
                self._inflight = _InFlight(
                    None, None, None, self._forward_pool.submit(self._forward_padding, pad_rows)
                )
            return
        checkpointer, metrics = self._checkpointer, self.metrics
        assert checkpointer is not None
        checkpoint = checkpointer.cut()  # what is consumed from now on is the next batch's
        with metrics.stage("enrich"):
            events = to_columns(records)
            enrichment = self.enricher.enrich(events.user_ids, events.candidate_ids)
        with metrics.stage("features"):
            features = build_feature_columns(events, enrichment, self.scorer.spec)
            inp = self.scorer.model_input(features)
        self._finish_inflight()
        pad = pad_rows if self._collective else None
        future = self._forward_pool.submit(self._forward, inp, pad, events)
        self._inflight = _InFlight(events, enrichment, checkpoint, future)
        if not self._overlap:
            self._finish_inflight()

    def _forward(self, inp: ModelInput, pad_rows: int | None, events: EventColumns) -> ScoredBatch:
        """On the scoring thread: one forward and the top-K of every event."""
        start = time.perf_counter()
        scored = self.scorer.top_k(self.scorer.forward(inp, pad_rows), events)
        self.metrics.stage_seconds.labels(stage="forward").observe(time.perf_counter() - start)
        return scored

    def _forward_padding(self, rows: int) -> None:
        self.scorer.forward_padding(rows)

    def _finish_inflight(self, wait: bool = True) -> None:
        """Publish the in-flight batch once its forward is done (``wait=False``: only if it
        already is)."""
        inflight = self._inflight
        if inflight is None or (not wait and not inflight.future.done()):
            return
        self._inflight = None
        scored = inflight.future.result()  # re-raises a failed forward
        if inflight.events is None or inflight.enrichment is None or scored is None:
            return
        assert inflight.checkpoint is not None
        self._publish(inflight.events, inflight.enrichment, scored, inflight.checkpoint)

    def _publish(
        self,
        events: EventColumns,
        enrichment: Enrichment,
        scored: ScoredBatch,
        checkpoint: Checkpoint,
    ) -> None:
        """Produce a scored batch's Recommendations, then seal its checkpoint."""
        sink, checkpointer, metrics = self._sink, self._checkpointer, self.metrics
        assert sink is not None and checkpointer is not None
        with metrics.stage("produce"):
            flags = fallback_flags(events, enrichment)
            latency_s = sink.publish(
                events.event_ids,
                events.user_ids,
                events.event_time_ms,
                scored.counts,
                scored.item_ids,
                scored.scores,
                flags,
                self.scorer.model_version,
                checkpoint,
            )
            checkpointer.seal(checkpoint)
        for feature, mask in (
            (FallbackFeature.USER, flags.user),
            (FallbackFeature.ITEM, flags.item),
        ):
            count = int(mask.sum())
            if count:
                metrics.fallbacks.labels(feature=feature.value).inc(count)
        metrics.batch_rows.observe(events.num_rows)
        summary = self.summary
        summary.events_out += events.num_events
        summary.rows_scored += events.num_rows
        summary.batches += 1
        summary.last_output_at = time.monotonic()
        if len(summary.latencies_s) < _MAX_LATENCY_SAMPLES:
            summary.latencies_s.extend(latency_s.tolist())

    # -- rebalances ----------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", [(p.topic, p.partition) for p in partitions])
        self.assignment |= {(p.topic, p.partition) for p in partitions}
        self._last_activity = time.monotonic()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit what is delivered before the partitions move to another member.

        A single process scores its open batch first, so the handover repeats nothing. A rank
        of a sharded model cannot run a forward alone (it is a collective), so it drops the
        revoked partitions' unscored events instead; their offsets stay uncommitted and the new
        owner scores them (at-least-once).
        """
        revoked = {(p.topic, p.partition) for p in partitions}
        log.info("revoked %s", sorted(revoked))
        self.assignment -= revoked
        checkpointer = self._checkpointer
        if checkpointer is None or self._failed:
            return
        # Polled but not yet fed: never registered for commit; the next owner gets them.
        kept = deque(m for m in self._backlog if (m.topic(), m.partition()) not in revoked)
        dropped = len(self._backlog) - len(kept)
        self._backlog = kept
        if self._held is not None and self._held[0][:2] in revoked:
            self._held = None
            dropped += 1
        if self._collective:
            self._finish_inflight()  # already stepped together; only publishing is left
            dropped += self.batcher.drop_partitions(revoked)
            checkpointer.forget_open(list(revoked))
            checkpointer.commit_delivered()
        else:
            self._score(self.batcher.close())
            self._finish_inflight()
            checkpointer.flush_and_commit()
        if dropped:
            log.info("left %d unscored events of revoked partitions to their next owner", dropped)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions already belong to someone else: results may repeat, commits would fail."""
        log.warning("lost %s", [(p.topic, p.partition) for p in partitions])
        self.assignment -= {(p.topic, p.partition) for p in partitions}
        if self._checkpointer is not None:
            self._checkpointer.forget([(p.topic, p.partition) for p in partitions])
