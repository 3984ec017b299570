"""The commit protocol (at-least-once): offsets are committed only after everything they caused
is delivered.

At-least-once, per input message: every consumed message leads to records on other topics (a
Recommendation, or a dead-letter record). Its offset becomes committable only when all records
produced for it, *and for every earlier message of its partition*, are acknowledged by the
broker. The protocol, owned entirely by :class:`Checkpointer`:

1. The loop registers consumed messages with :meth:`Checkpointer.consumed` (in poll order):
   they join the open :class:`~pipeline.types.Checkpoint`.
2. When a micro-batch closes, :meth:`Checkpointer.cut` ends the open checkpoint there: the batch
   carries it (``Batch.checkpoint``), and what is consumed from then on joins the next one.
3. Every record produced for consumed messages is counted into its checkpoint first
   (``checkpoint.expect(n)``), and the Kafka edge acknowledges it there: the sinks
   (:mod:`pipeline.stages.publish`, :mod:`pipeline.stages.dead_letter`) see only the checkpoint
   of their records, never the :class:`Checkpointer`. Once a batch's records are all produced
   its checkpoint is sealed (``checkpoint.seal()``).
4. :meth:`Checkpointer.commit_ready` commits, in order, the leading sealed checkpoints whose
   records are all acknowledged (asynchronously, so the hot loop never waits on the broker; at
   most every ``delivery.commit_interval_ms``); while more than ``max_sealed`` sealed
   checkpoints wait for acknowledgements it waits (without pausing the input).
5. On partition revocation (inside the rebalance callback, where nothing else can wait),
   :meth:`Checkpointer.flush_and_commit` waits for every acknowledgement and commits
   synchronously. On shutdown, :meth:`Checkpointer.flush_and_send` waits for them and sends the
   commit asynchronously: the drain keeps polling until the group has answered it
   (:meth:`Checkpointer.send_again` after a refusal), because a member that blocks in a
   commit while its group rebalances holds up the rebalance, and the group holds the commit
   until the rebalance is over (up to the request timeout).

Commit results are checked: with :class:`~pipeline.connectors.kafka.consumer.CommitResults` wired to
the consumer's ``on_commit``, :attr:`Checkpointer.committed` advances only when the broker confirms
a commit. An asynchronous commit whose result has not come yet is not done: its offsets count as
uncommitted (:meth:`Checkpointer.uncommitted_events`) and every synchronous commit (shutdown,
revocation) carries them again, so a stop never rests on a request the group may still refuse
(during a rebalance the broker can hold a commit for seconds, then refuse it with
``ILLEGAL_GENERATION``). A failed commit is logged, counted
(:attr:`Checkpointer.commit_failures`) and its offsets are committed again with the next commit
(at the latest :data:`RETRY_COMMIT_S` later);
:attr:`Checkpointer.commit_error` says why it failed, so that a drain can tell a group that is
rebalancing (wait and commit again: :mod:`pipeline.runtime.drain`) from a refusal, and
:meth:`Checkpointer.uncommitted_events` how many consumed events are not committed.

A failed delivery poisons its checkpoint: :meth:`commit_ready` raises :class:`DeliveryFailed`
and nothing at or after that checkpoint is committed, so a restart reprocesses those messages.

Exactly-once (``delivery.guarantee``) is a flag of the same protocol: :mod:`.transactions`
replaces *how* the sealed checkpoints are committed (Kafka transactions).
"""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
import numpy.typing as npt

from model.features.segments import group_values
from pipeline.connectors.kafka.consumer import CommitResults, InputConsumer
from pipeline.connectors.kafka.errors import KafkaClientError
from pipeline.connectors.kafka.producer import OutputProducer
from pipeline.types import Checkpoint, DeliveryFailed, Partition, Shutdown

log = logging.getLogger(__name__)

RETRY_COMMIT_S = 1.0
"""Offsets of a failed commit are retried with the next commit, or after this long."""


class Checkpointer:
    """Owns the commit protocol described in the module docstring.

    Args:
        consumer: commits offsets (only ``commit`` and ``commit_sync`` are used).
        producer: the producer every output/DLQ record goes through (``poll``, ``flush``).
        max_sealed: sealed-but-unacknowledged checkpoints allowed before :meth:`commit_ready`
            waits.
        commit_results: the consumer's ``on_commit`` (``None``: an asynchronous commit is
            taken as done when it is sent).
        shutdown: once a stop is requested, every wait ends by its deadline.
        commit_interval_s: the least time between two asynchronous commits (every commit is a
            request the broker serves; 0: after every batch). Shutdown and revocation commit
            at once.

    Example::

        ckpt = Checkpointer(consumer, producer)
        ckpt.consumed("events", partitions, offsets)      # a poll's messages, in order
        checkpoint = ckpt.cut()                          # the batch closes
        checkpoint.expect(len(values))                   # then producer.send(..., checkpoint)
        checkpoint.seal()                                # its records are all produced
        ckpt.commit_ready()
    """

    def __init__(
        self,
        consumer: InputConsumer,
        producer: OutputProducer,
        max_sealed: int = 4,
        commit_results: CommitResults | None = None,
        shutdown: Shutdown | None = None,
        commit_interval_s: float = 0.0,
    ) -> None:
        self._consumer = consumer
        self._producer = producer
        self._max_sealed = max_sealed
        self._open = self._new_checkpoint()
        self._checkpoints: deque[Checkpoint] = deque()
        """Cut checkpoints in commit order (sealed or still being produced)."""
        self._confirmed = commit_results is not None
        if commit_results is not None:
            commit_results.listener = self.on_commit
        self._retry: dict[Partition, int] = {}
        self._sent: dict[Partition, int] = {}
        """The furthest offsets of asynchronous commits sent and not answered yet (with
        ``commit_results``)."""
        self._retry_at = 0.0
        self.committed: dict[Partition, int] = {}
        """Offsets the broker confirmed (or, without ``commit_results``, sent)."""
        self._resume: dict[Partition, int] = {}
        """Per partition consumed since it was assigned, where to go back to: its last offset
        committed since then, else the first one consumed (:meth:`abort`)."""
        self.commit_failures = 0
        self.commit_error: KafkaClientError | None = None
        """Why the latest failed commit failed, while its offsets wait for another one."""
        self._shutdown = shutdown
        self._commit_interval_s = commit_interval_s
        self._next_commit_at = 0.0
        group_values(np.zeros(1, dtype=np.int64))  # load (or compile) the kernel now

    @property
    def producer(self) -> OutputProducer:
        return self._producer  # the producer whose records the checkpoints guard

    @property
    def deadline(self) -> float | None:
        """``time.monotonic()`` by which every wait must end (``None`` until a stop)."""
        return self._shutdown.deadline if self._shutdown is not None else None

    def _new_checkpoint(self) -> Checkpoint:
        return Checkpoint()

    def consumed(
        self, topic: str, partitions: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64]
    ) -> None:
        """Messages were consumed (in poll order): the open checkpoint now covers them.

        Args:
            topic: their topic.
            partitions / offsets: int64[M] each message's partition and offset.
        """
        if not len(partitions):
            return
        # The first message of each partition is where it started, the last one sets its next
        # offset (poll order is offset order).
        heads, first, last, _ = group_values(np.ascontiguousarray(partitions, dtype=np.int64))
        for partition, offset in zip(heads.tolist(), offsets[first].tolist(), strict=True):
            self._resume.setdefault((topic, partition), offset)
        for partition, offset in zip(heads.tolist(), offsets[last].tolist(), strict=True):
            self._open.next_offsets[(topic, partition)] = offset + 1

    @property
    def open(self) -> Checkpoint:
        """The checkpoint that messages consumed now belong to (dead letters guard it)."""
        return self._open

    def cut(self) -> Checkpoint:
        """End the open checkpoint here and queue it (commit order); it commits once it is
        sealed (``checkpoint.seal()``: its records are all produced) and acknowledged.

        For a batch whose records are produced later (its forward still running): what is
        consumed from now on belongs to the next checkpoint.
        """
        checkpoint, self._open = self._open, self._new_checkpoint()
        self._checkpoints.append(checkpoint)
        return checkpoint

    def seal_open(self) -> None:
        """Cut and seal the open checkpoint when it holds anything (offsets of dead-lettered
        messages alone, between batches)."""
        if self._open.next_offsets or self._open.pending:
            self.cut().seal()

    def commit_ready(self) -> int:
        """Commit the leading sealed checkpoints that are acknowledged (asynchronously, at most
        every ``commit_interval_s``); while more than ``max_sealed`` sealed checkpoints wait for
        acknowledgements, wait (serving delivery callbacks).

        The wait does not pause the input: librdkafka's prefetch is bounded on its own
        (``queued.max.messages.kbytes``), and a paused partition loses its prefetched messages,
        so a short pause stalls delivery for far longer than the wait (BENCHMARKS.md).

        Returns:
            How many checkpoints were committed.

        Raises:
            DeliveryFailed: a record of a leading checkpoint failed (nothing from it on is
                committed), or the shutdown deadline passed while waiting.
        """
        self._producer.poll(0)
        count = self._commit_if_due()
        while self._unacknowledged() > self._max_sealed:
            deadline = self.deadline
            if deadline is not None and time.monotonic() >= deadline:
                raise DeliveryFailed("shutdown deadline passed waiting for acknowledgements")
            self._producer.poll(0.05)
            count += self._commit_if_due()
        return count

    def _commit_if_due(self) -> int:
        """:meth:`_commit_done` (asynchronously) once ``commit_interval_s`` has passed since the
        last commit."""
        now = time.monotonic()
        if now < self._next_commit_at:
            return 0
        count = self._commit_done(asynchronous=True)
        if count:
            self._next_commit_at = now + self._commit_interval_s
        return count

    def _unacknowledged(self) -> int:
        """Sealed checkpoints still waiting for acknowledgements."""
        return sum(1 for c in self._checkpoints if c.sealed and not c.done)

    def _waiting(self) -> int:
        """Sealed checkpoints at the head of the queue (committable once acknowledged)."""
        waiting = 0
        for checkpoint in self._checkpoints:
            if not checkpoint.sealed:
                break
            waiting += 1
        return waiting

    def _commit_done(self, asynchronous: bool) -> int:
        """Commit the leading sealed checkpoints that are fully acknowledged."""
        merged: dict[Partition, int] = {}
        count = 0
        while self._checkpoints and self._checkpoints[0].done:
            checkpoint = self._checkpoints[0]
            if checkpoint.error is not None:
                self._commit(merged, asynchronous)
                raise DeliveryFailed(checkpoint.error)
            self._checkpoints.popleft()
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
        self.seal_open()
        self._flush_and_commit(timeout_s)

    def flush_and_send(self, timeout_s: float = 30.0) -> None:
        """Seal, wait for every acknowledgement, and send the commit asynchronously (with the
        offsets of refused commits): the caller polls until :meth:`uncommitted_events` is 0,
        calling :meth:`send_again` meanwhile.

        Raises:
            DeliveryFailed: records were still unacknowledged (their offsets stay uncommitted).
        """
        self.seal_open()
        self._flush_and_commit(timeout_s, asynchronous=True)

    def send_again(self) -> None:
        """While a stop waits for its commit: once no commit is in flight, send what is
        acknowledged and the refused offsets again (asynchronously), unless the refusal is one
        that waiting does not cure."""
        error = self.commit_error
        if self._sent or (error is not None and not (error.group_busy or error.retriable)):
            return
        self._retry_at = 0.0
        self._commit_done(asynchronous=True)

    @property
    def commits_in_flight(self) -> bool:
        """Whether an asynchronous commit has not been answered yet."""
        return bool(self._sent)

    def _flush_and_commit(self, timeout_s: float, asynchronous: bool = False) -> None:
        deadline = self.deadline
        if deadline is not None:
            timeout_s = max(0.0, min(timeout_s, deadline - time.monotonic()))
        remaining = self._producer.flush(timeout_s)
        self._commit_done(asynchronous)
        if remaining:
            raise DeliveryFailed(f"{remaining} records still undelivered after {timeout_s:.1f}s")

    def commit_delivered(self, timeout_s: float = 30.0) -> None:
        """Wait for every acknowledgement and commit the sealed checkpoints synchronously.

        Unlike :meth:`flush_and_commit`, the open checkpoint stays open (its batch is not
        produced yet).
        """
        self._flush_and_commit(timeout_s)

    def uncommitted_events(self, partitions: set[Partition] | None = None) -> int:
        """How many consumed events (of ``partitions``; default: all) are not committed: per
        partition, the furthest offset consumed minus where it would go back to (:meth:`abort`).
        """
        consumed = (c.next_offsets for c in (*self._checkpoints, self._open))
        furthest = _furthest(self._retry, self._sent, *consumed)
        count = 0
        for key, offset in furthest.items():
            if partitions is not None and key not in partitions:
                continue
            count += max(0, offset - self._resume.get(key, offset))
        return count

    def abort(self) -> dict[Partition, int]:
        """Drop every checkpoint not committed: the loop goes back and consumes their messages
        again (:meth:`pipeline.runtime.drain.Drain.rewind`).

        Returns:
            Per partition consumed since it was assigned, where to go back to: its last offset
            committed since then, else the first one consumed.
        """
        offsets = dict(self._resume)
        self._checkpoints.clear()
        self._open = self._new_checkpoint()
        self._retry.clear()
        self._sent.clear()
        self.commit_error = None
        return offsets

    def handed_over(self, partitions: set[Partition]) -> int:
        """``partitions`` moved to another member after their revocation's commit: what of
        theirs is still uncommitted stays so (committing it later could move the new owner's
        offsets back; the new owner resumes from the last commit).

        Returns:
            How many consumed events of theirs were left uncommitted.
        """
        left = self.uncommitted_events(partitions)
        self._drop(partitions)
        return left

    def forget_open(self, partitions: list[Partition]) -> None:
        """Drop the open checkpoint's offsets of ``partitions`` (their events were not produced
        and will be consumed again by the partitions' next owner)."""
        for key in set(partitions) & self._open.next_offsets.keys():
            del self._open.next_offsets[key]

    def forget(self, partitions: list[Partition]) -> None:
        """Drop uncommitted offsets of partitions we no longer own (after a lost assignment)."""
        self._drop(set(partitions))

    def _drop(self, partitions: set[Partition]) -> None:
        """Forget ``partitions``' uncommitted offsets and where they would go back to (a later
        assignment starts afresh)."""
        for checkpoint in (*self._checkpoints, self._open):
            for key in partitions & checkpoint.next_offsets.keys():
                del checkpoint.next_offsets[key]
        for table in (self._retry, self._sent, self._resume):
            for key in partitions & table.keys():
                del table[key]
        if not self._retry:
            self.commit_error = None

    @property
    def in_flight(self) -> int:
        """Records produced and not yet acknowledged."""
        return self._open.pending + sum(c.pending for c in self._checkpoints)

    def on_commit(
        self,
        error: KafkaClientError | None,
        offsets: dict[Partition, int],
        errors: dict[Partition, KafkaClientError],
    ) -> None:
        """A commit's result (``CommitResults`` calls it: the commit's ``error``, its
        ``offsets``, each failed partition's ``errors``): advance :attr:`committed`, or keep
        failed offsets for the next commit."""
        if error is not None:
            self._failed(offsets, str(error), error)
            return
        if errors:
            failed = {key: offsets[key] for key in errors if key in offsets}
            reasons = list(errors.values())
            self._failed(failed, "; ".join(str(e) for e in reasons), reasons[0])
        self._advance({k: v for k, v in offsets.items() if k not in errors})

    def _advance(self, offsets: dict[Partition, int]) -> None:
        for key, offset in offsets.items():
            if offset >= 0 and offset > self.committed.get(key, -1):
                self.committed[key] = offset
            if key in self._resume:
                self._resume[key] = max(self._resume[key], offset)
            if self._retry.get(key, -1) <= offset:
                self._retry.pop(key, None)
            if self._sent.get(key, -1) <= offset:
                self._sent.pop(key, None)
        if not self._retry:
            self.commit_error = None

    def _failed(self, offsets: dict[Partition, int], reason: str, error: KafkaClientError) -> None:
        self.commit_failures += 1
        self.commit_error = error
        log.warning("offset commit failed (%s): will retry %s", reason, offsets)
        for key, offset in offsets.items():
            if key not in self._resume:
                continue  # handed over since it was sent: its new owner commits it
            if offset > max(self.committed.get(key, -1), self._retry.get(key, -1)):
                self._retry[key] = offset
            if self._sent.get(key, -1) <= offset:
                self._sent.pop(key, None)  # answered (a later commit may still be in flight)
        self._retry_at = time.monotonic() + RETRY_COMMIT_S

    def _commit(self, offsets: dict[Partition, int], asynchronous: bool) -> None:
        if self._retry and (offsets or not asynchronous or time.monotonic() >= self._retry_at):
            offsets = _furthest(self._retry, offsets)  # newer offsets supersede retried ones
            self._retry_at = time.monotonic() + RETRY_COMMIT_S
        if not asynchronous and self._sent:
            offsets = _furthest(self._sent, offsets)  # not answered yet: not done
        if not offsets:
            return
        if asynchronous:
            self._consumer.commit(offsets)
            if self._confirmed:
                self._sent = _furthest(self._sent, offsets)
            else:
                self._advance(offsets)
            log.debug("committing %s", offsets)
            return
        try:
            errors = self._consumer.commit_sync(offsets)
        except KafkaClientError as exc:
            self._failed(offsets, str(exc), exc)
            return
        self.on_commit(None, offsets, errors)
        log.debug("committed %s", offsets)


def _furthest(*tables: dict[Partition, int]) -> dict[Partition, int]:
    """Per partition, the furthest offset of ``tables`` (a commit position only moves on)."""
    merged: dict[Partition, int] = {}
    for table in tables:
        for key, offset in table.items():
            merged[key] = max(offset, merged.get(key, -1))
    return merged
