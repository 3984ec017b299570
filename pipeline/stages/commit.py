"""The commit protocol: offsets are committed only after everything they caused is delivered.

At-least-once, per input message: every consumed message leads to records on other topics (a
Recommendation, or a dead-letter record). Its offset becomes committable only when all records
produced for it, *and for every earlier message of its partition*, are acknowledged by the
broker. The protocol, owned entirely by :class:`Checkpointer`:

1. The loop reports each consumed message with :meth:`Checkpointer.consumed` (in poll order).
2. Every record produced on behalf of consumed messages passes ``checkpoint.expect_delivery()``
   as its ``on_delivery``: the sinks (:mod:`pipeline.stages.publish`) see only the
   :class:`Checkpoint` of their batch, never the :class:`Checkpointer`.
3. When a micro-batch has been produced, :meth:`Checkpointer.seal` closes the open checkpoint:
   it now covers every message consumed so far that was not covered before.
4. :meth:`Checkpointer.commit_ready` commits, in order, the sealed checkpoints whose records are
   all acknowledged (asynchronously, so the hot loop never waits on the broker).
5. On shutdown or partition revocation, :meth:`Checkpointer.flush_and_commit` waits for every
   acknowledgement and commits synchronously.

Commit results are checked: with :class:`~pipeline.kafka_io.CommitResults` wired to the
consumer's ``on_commit``, :attr:`Checkpointer.committed` advances only when the broker confirms
a commit. A failed commit is logged, counted (:attr:`Checkpointer.commit_failures`) and its
offsets are committed again with the next commit (at the latest :data:`RETRY_COMMIT_S` later).

A failed delivery poisons its checkpoint: :meth:`commit_ready` raises :class:`DeliveryFailed`
and nothing at or after that checkpoint is committed, so a restart reprocesses those messages.

An exactly-once mode (Kafka transactions with ``send_offsets_to_transaction``) and multi-rank
stepping plug in here: they replace *when* and *how* a sealed checkpoint is committed.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from pipeline.kafka_io import CommitResults, CommittingConsumer, DeliveryCallback, PollingProducer

log = logging.getLogger(__name__)

RETRY_COMMIT_S = 1.0
"""Offsets of a failed commit are retried with the next commit, or after this long."""


class DeliveryFailed(RuntimeError):
    """A record could not be delivered; the offsets it guards were not committed."""


@dataclass
class Checkpoint:
    """Offsets guarded by a group of produced records.

    Attributes:
        next_offsets: (topic, partition) -> offset to commit (last consumed offset + 1).
        pending: records produced but not acknowledged yet.
        error: the first delivery error, if any.
    """

    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    pending: int = 0
    sealed: bool = False
    error: str | None = None
    before_produce: Callable[[], None] | None = None
    """Called before each record is produced (exactly-once: begins the transaction)."""

    def expect_delivery(self) -> DeliveryCallback:
        """Count one more record produced on behalf of these offsets.

        Returns:
            Its ``on_delivery`` callback: the broker's acknowledgement flows back here.
        """
        if self.before_produce is not None:
            self.before_produce()
        self.pending += 1
        return self.on_delivery

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        self.pending -= 1
        if err is not None and self.error is None:
            self.error = f"delivery to {msg.topic()} failed: {err}"

    @property
    def done(self) -> bool:
        return self.sealed and self.pending == 0


class Checkpointer:
    """Owns the commit protocol described in the module docstring.

    Args:
        consumer: commits offsets (only ``commit`` is used).
        producer: the producer every output/DLQ record goes through (only ``poll`` and
            ``flush`` are used).
        max_sealed: sealed-but-unacknowledged checkpoints allowed before :meth:`seal` waits.
        commit_results: the consumer's ``on_commit`` (``None``: an asynchronous commit is
            taken as done when it is sent).

    Example::

        ckpt = Checkpointer(consumer, producer)
        for msg in consumer.consume(500, 0.1):
            ckpt.consumed(msg.topic(), msg.partition(), msg.offset())
            producer.produce(..., on_delivery=ckpt.delivery_callback())
        ckpt.seal()
        ckpt.commit_ready()
    """

    def __init__(
        self,
        consumer: CommittingConsumer,
        producer: PollingProducer,
        max_sealed: int = 4,
        commit_results: CommitResults | None = None,
    ) -> None:
        self._consumer = consumer
        self._producer = producer
        self._max_sealed = max_sealed
        self._open = self._new_checkpoint()
        self._sealed: deque[Checkpoint] = deque()
        self._confirmed = commit_results is not None
        if commit_results is not None:
            commit_results.listener = self.on_commit
        self._retry: dict[tuple[str, int], int] = {}
        self._retry_at = 0.0
        self.committed: dict[tuple[str, int], int] = {}
        """Offsets the broker confirmed (or, without ``commit_results``, sent)."""
        self.commit_failures = 0
        self.deadline: float | None = None
        self.backpressure: Callable[[], AbstractContextManager[None]] = nullcontext
        """Held while :meth:`seal` waits for acknowledgements (the source pauses fetching)."""
        """``time.monotonic()`` by which every wait must end (set on shutdown)."""

    def _new_checkpoint(self) -> Checkpoint:
        return Checkpoint()

    def consumed(self, topic: str, partition: int, offset: int) -> None:
        """Record that the message at ``offset`` was consumed (call in poll order)."""
        self._open.next_offsets[(topic, partition)] = offset + 1

    def delivery_callback(self, checkpoint: Checkpoint | None = None) -> DeliveryCallback:
        """The ``on_delivery`` for one record produced on behalf of ``checkpoint`` (default:
        the open one)."""
        return (checkpoint or self._open).expect_delivery()

    @property
    def open(self) -> Checkpoint:
        """The checkpoint that messages consumed now belong to (dead letters guard it)."""
        return self._open

    def cut(self) -> Checkpoint:
        """End the open checkpoint here without sealing it, and queue it (commit order).

        For a batch whose records are produced later (its forward still running): what is
        consumed from now on belongs to the next checkpoint. Produce the batch's records with
        ``delivery_callback(checkpoint)``, then :meth:`seal` it.
        """
        checkpoint, self._open = self._open, self._new_checkpoint()
        self._sealed.append(checkpoint)
        return checkpoint

    def seal(self, checkpoint: Checkpoint | None = None) -> None:
        """Mark a checkpoint complete (default: cut and seal the open one); it is committed
        once all its records are acknowledged.

        Bounds memory: waits for acknowledgements while more than ``max_sealed`` are queued.
        """
        if checkpoint is None:
            if not self._open.next_offsets and self._open.pending == 0:
                return
            checkpoint = self.cut()
        checkpoint.sealed = True
        self._producer.poll(0)
        if len(self._sealed) <= self._max_sealed:
            return
        with self.backpressure():
            while len(self._sealed) > self._max_sealed and self._sealed[0].sealed:
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    raise DeliveryFailed("shutdown deadline passed waiting for acknowledgements")
                self._producer.poll(0.05)
                self.commit_ready()

    def commit_ready(self, asynchronous: bool = True) -> int:
        """Commit the leading sealed checkpoints that are fully acknowledged.

        Returns:
            How many checkpoints were committed.

        Raises:
            DeliveryFailed: a record of a leading checkpoint failed; nothing from it on is
                committed.
        """
        merged: dict[tuple[str, int], int] = {}
        count = 0
        while self._sealed and self._sealed[0].done:
            checkpoint = self._sealed[0]
            if checkpoint.error is not None:
                self._commit(merged, asynchronous)
                raise DeliveryFailed(checkpoint.error)
            self._sealed.popleft()
            merged.update(checkpoint.next_offsets)
            count += 1
        self._commit(merged, asynchronous)
        return count

    def flush_and_commit(self, timeout_s: float = 30.0) -> None:
        """Seal, wait for every acknowledgement, and commit synchronously.

        The wait ends at ``timeout_s`` or at :attr:`deadline`, whichever comes first; what is
        acknowledged by then is still committed.

        Raises:
            DeliveryFailed: records were still unacknowledged (their offsets stay uncommitted).
        """
        self.seal()
        self._flush_and_commit(timeout_s)

    def _flush_and_commit(self, timeout_s: float) -> None:
        if self.deadline is not None:
            timeout_s = max(0.0, min(timeout_s, self.deadline - time.monotonic()))
        remaining = self._producer.flush(timeout_s)
        self.commit_ready(asynchronous=False)
        if remaining:
            raise DeliveryFailed(f"{remaining} records still undelivered after {timeout_s:.1f}s")

    def commit_delivered(self, timeout_s: float = 30.0) -> None:
        """Wait for every acknowledgement and commit the sealed checkpoints synchronously.

        Unlike :meth:`flush_and_commit`, the open checkpoint stays open (its batch is not
        produced yet).
        """
        self._flush_and_commit(timeout_s)

    def forget_open(self, partitions: list[tuple[str, int]]) -> None:
        """Drop the open checkpoint's offsets of ``partitions`` (their events were not produced
        and will be consumed again by the partitions' next owner)."""
        for key in set(partitions) & self._open.next_offsets.keys():
            del self._open.next_offsets[key]

    def forget(self, partitions: list[tuple[str, int]]) -> None:
        """Drop uncommitted offsets of partitions we no longer own (after a lost assignment)."""
        lost = set(partitions)
        for checkpoint in (*self._sealed, self._open):
            for key in lost & checkpoint.next_offsets.keys():
                del checkpoint.next_offsets[key]
        for key in lost & self._retry.keys():
            del self._retry[key]

    @property
    def in_flight(self) -> int:
        """Records produced and not yet acknowledged."""
        return self._open.pending + sum(c.pending for c in self._sealed)

    def on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The consumer's ``on_commit``: advance :attr:`committed`, or keep failed offsets for
        the next commit."""
        offsets = {(tp.topic, tp.partition): tp.offset for tp in partitions}
        if err is not None:
            self._failed(offsets, str(err))
            return
        failed = {(tp.topic, tp.partition): tp.offset for tp in partitions if tp.error}
        if failed:
            self._failed(failed, "; ".join(str(tp.error) for tp in partitions if tp.error))
        self._advance({k: v for k, v in offsets.items() if k not in failed})

    def _advance(self, offsets: dict[tuple[str, int], int]) -> None:
        for key, offset in offsets.items():
            if offset >= 0 and offset > self.committed.get(key, -1):
                self.committed[key] = offset
            if self._retry.get(key, -1) <= offset:
                self._retry.pop(key, None)

    def _failed(self, offsets: dict[tuple[str, int], int], reason: str) -> None:
        self.commit_failures += 1
        log.warning("offset commit failed (%s): will retry %s", reason, offsets)
        for key, offset in offsets.items():
            if offset > max(self.committed.get(key, -1), self._retry.get(key, -1)):
                self._retry[key] = offset
        self._retry_at = time.monotonic() + RETRY_COMMIT_S

    def _commit(self, offsets: dict[tuple[str, int], int], asynchronous: bool) -> None:
        if self._retry and (offsets or not asynchronous or time.monotonic() >= self._retry_at):
            offsets = {**self._retry, **offsets}  # newer offsets supersede retried ones
            self._retry_at = time.monotonic() + RETRY_COMMIT_S
        if not offsets:
            return
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        if asynchronous:
            self._consumer.commit(offsets=tps, asynchronous=True)
            if not self._confirmed:
                self._advance(offsets)
            log.debug("committing %s", offsets)
            return
        try:
            result = self._consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            self._failed(offsets, str(exc))
            return
        self.on_commit(None, result if result is not None else tps)
        log.debug("committed %s", offsets)
