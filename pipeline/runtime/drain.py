"""Finish, publish, commit: how the loop ends its open work, at its stop step and for partitions
taken away from it.

The loop builds one :class:`Drain` per run and owns it. It drains at its stop step
(:meth:`Drain.finish` closes the open batch, scores and publishes it with the one in flight;
:meth:`Drain.commit` waits for every acknowledgement and commits). A revocation needs the same
work done before the partitions move, which librdkafka allows only inside its revoke callback
(it hands the partitions over when the callback returns), so the rebalance handler
(:mod:`pipeline.runtime.rebalance`) calls :meth:`Drain.revoked` from inside ``poll()``, which
runs the same two steps:

- a single process finishes its open batch (the revoked partitions' events included), then
  commits everything, so the handover repeats nothing;
- a rank of a sharded model cannot run a forward alone (it is a collective), so it publishes
  only the batch in flight, drops the revoked partitions' events from its open batch and
  commits what is delivered; the new owner scores them (at-least-once).

Events of revoked partitions still waiting for a batch are dropped (never registered for
commit, so the next owner consumes them); whatever of theirs could not be committed in the
callback is left to the next owner (committed later, it could move its offsets back).

**The stop's commit holds whatever the group does.** It is sent asynchronously and the drain
keeps polling, with every partition paused (what arrives is dropped, never committed), until
the group has answered it: a group that rebalances holds a commit until the rebalance is over
and then refuses it (``REBALANCE_IN_PROGRESS``; ``ILLEGAL_GENERATION`` or ``UNKNOWN_MEMBER_ID``
from a member that has not rejoined yet), and a rebalance waits for every member's part in it
(a member blocked in a synchronous commit would hold it up, and its commit with it, until the
request times out). So this member takes its part (its revoke callback commits what it hands
over) and commits again after a refusal, until the commit goes through or
``shutdown.timeout_s`` (from the stop request) has passed. Members leave the group only after
every member of the job has committed (a barrier over the stepper:
:meth:`~pipeline.runtime.stepping.StepAgreement.all_drained`; a member that left early would
start a rebalance under the others' last commits); members already done keep polling meanwhile.
What could not be committed is said in one log line: how many consumed events, and why (their
outputs are published; the next run scores them again).

**Rewind** (exactly-once): when a transaction cannot be committed (an abortable error, its
budget spent, partitions lost while it was open), every member drops its open work at one
agreed step (:attr:`~pipeline.runtime.stepping.StepDecision.rewind`): the batch in flight and
the open batch are dropped unpublished, the transaction is aborted (after any transactional
call still in flight has returned; the aborted records are invisible to ``read_committed``
readers, and their purged deliveries fail nobody), and every assigned partition goes back to
the offsets last committed (tracked here: the coordinator may be down), to be scored again
(:meth:`Drain.rewind`).
"""

from __future__ import annotations

import logging
import time

from pipeline.runtime.backpressure import BackpressuredProducer
from pipeline.runtime.pausing import InputPause
from pipeline.runtime.processor import BatchProcessor
from pipeline.runtime.stepping import Stepper
from pipeline.stages.batch import MicroBatcher
from pipeline.stages.commit import Checkpointer
from pipeline.stages.source import KafkaSource, Partition
from pipeline.types import Batch, DeliveryFailed, Shutdown

log = logging.getLogger(__name__)

SETTLE_POLL_S = 0.2
"""While the group settles, each poll waits this long for rebalance callbacks; the commit is
tried again after each."""


class Drain:
    """The loop's finish, publish and commit (see the module docstring).

    Args:
        batcher: the open batch (and the decoded events waiting for the next one).
        checkpointer: the commit protocol.
        processor: scores and publishes batches (and the one in flight).
        source: polled while the group settles.
        producer: the sinks' producer (a rewind may hand it a new one).
        pause: pauses every partition meanwhile.
        stepper: the barrier with the job's other members (and whether forwards are
            collective).
        shutdown: the stop request; its ``timeout_s`` bounds the stop's commit.

    Example::

        drain = Drain(batcher, checkpointer, processor, source, producer, pause, stepper,
                      shutdown)
        drain.finish()   # the stop step
        drain.commit()
    """

    def __init__(
        self,
        batcher: MicroBatcher,
        checkpointer: Checkpointer,
        processor: BatchProcessor,
        source: KafkaSource,
        producer: BackpressuredProducer,
        pause: InputPause,
        stepper: Stepper,
        shutdown: Shutdown,
    ) -> None:
        self._batcher = batcher
        self._checkpointer = checkpointer
        self._processor = processor
        self._source = source
        self._producer = producer
        self._pause = pause
        self._stepper = stepper
        self._collective = stepper.collective
        self._shutdown = shutdown
        self._timeout_s = shutdown.timeout_s
        self.closing = False
        """Nothing more is scored or committed: set by the loop after an error, and by
        :meth:`commit` once the stop's commit is over. A revocation while the consumer closes
        then leaves what is uncommitted to the next run (a synchronous commit while the group
        rebalances could block the close until the request times out)."""

    def finish(self, pad_rows: int | None = None) -> None:
        """Close the open batch, score and publish it after the one in flight, and wait.

        Args:
            pad_rows: the rows the ranks agreed on for this step (ignored alone).
        """
        closed = self._batcher.close()
        batch = Batch(*closed, self._checkpointer.cut()) if closed is not None else None
        self._processor.submit(batch, pad_rows=pad_rows)
        self._processor.collect(wait=True)

    def commit(self) -> None:
        """Wait for every acknowledgement and send the commit; until the group has answered it,
        poll with every partition paused (and after a refusal commit again); then wait for every
        member of the
        job to have done the same (all within ``shutdown.timeout_s`` of the stop request).

        Raises:
            DeliveryFailed: records were still unacknowledged (their offsets stay uncommitted),
                or a transaction could not be committed.
        """
        deadline = self._shutdown.deadline or time.monotonic() + self._timeout_s
        failure: DeliveryFailed | None = None
        try:
            self._checkpointer.flush_and_send(self._timeout_s)
        except DeliveryFailed as exc:
            failure = exc
        done = False
        while True:
            if not done:
                done = self._settled(deadline, failure)
            if self._stepper.all_drained(done):
                break
            if done and not self._collective and time.monotonic() >= deadline:
                break  # peers that step alone are waited for until the deadline at most
            self._pause.hold_everything()
            self._source.poll(SETTLE_POLL_S)  # rebalance callbacks run in here
            self._source.take(self._source.backlog)  # never registered: never committed
            if not done:
                self._checkpointer.send_again()
        self.closing = True
        if failure is not None:
            raise failure

    def _settled(self, deadline: float, failure: DeliveryFailed | None) -> bool:
        """Whether this member's commit is over: everything committed, or it cannot be (a
        refusal that waiting does not cure, the deadline passed; said in one log line)."""
        checkpointer = self._checkpointer
        left = checkpointer.uncommitted_events()
        if not left:
            return True
        error = checkpointer.commit_error
        if failure is None and time.monotonic() < deadline:
            if checkpointer.commits_in_flight:
                return False  # not answered yet (held while the group rebalances)
            # a group moving partitions (or a member that must rejoin): it goes through once
            # the group has settled
            if error is not None and (error.group_busy or error.retriable):
                return False
        if failure is not None:
            reason = str(failure)
        elif error is None and checkpointer.commits_in_flight:
            reason = "the group has not answered the commit"
        else:
            reason = str(error)
        log.error(
            "drain: the offsets of %d consumed events are not committed (%s); their outputs "
            "are published, the next run scores them again",
            left,
            reason,
        )
        return True

    def revoked(self, partitions: set[Partition]) -> int:
        """Partitions are being revoked (inside the revoke callback): finish and commit what
        they hold, or leave it to their next owner.

        Returns:
            How many decoded events of theirs were dropped, unscored.
        """
        if self.closing:
            return 0
        checkpointer, batcher = self._checkpointer, self._batcher
        try:
            if self._collective:
                self._processor.collect(wait=True)  # stepped together: publishing is left
                dropped = batcher.drop_partitions(partitions)
                checkpointer.forget_open(list(partitions))
                checkpointer.commit_delivered()
            else:
                self.finish()
                dropped = batcher.drop_partitions(partitions)  # waiting for the next batch
                checkpointer.flush_and_commit()
        finally:
            left = checkpointer.handed_over(partitions)
        if left:
            log.error(
                "revoked %s: the offsets of %d consumed events are not committed (%s); the "
                "next owner scores them again",
                sorted(partitions),
                left,
                checkpointer.commit_error,
            )
        return dropped

    def rewind(self) -> None:
        """Drop the open work unpublished, abort the open transaction, and go back to the
        offsets last committed (see the module docstring).

        Raises:
            DeliveryFailed: the transaction could not be aborted (the producer was fenced, the
                error is fatal, or the shutdown deadline passed first).
        """
        dropped = self._processor.discard() + self._batcher.clear()
        offsets = self._checkpointer.abort()
        # The same producer, or the one that replaced it: the records go there from now on.
        self._producer.use(self._checkpointer.producer)
        self._source.rewind(offsets)
        log.info("rewound: %d events dropped before they were published", dropped)

    def lost(self, partitions: set[Partition]) -> None:
        """Partitions already belong to someone else: forget their uncommitted offsets."""
        self._checkpointer.forget(list(partitions))
