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
commit, so the next owner consumes them).
"""

from __future__ import annotations

from pipeline.runtime.processor import BatchProcessor
from pipeline.stages.batch import MicroBatcher
from pipeline.stages.commit import Checkpointer
from pipeline.stages.source import Partition
from pipeline.types import Batch


class Drain:
    """The loop's finish, publish and commit (see the module docstring).

    Args:
        batcher: the open batch (and the decoded events waiting for the next one).
        checkpointer: the commit protocol.
        processor: scores and publishes batches (and the one in flight).
        collective: ranks of a sharded model (forwards only together).
        timeout_s: the longest the stop's commit waits for acknowledgements
            (``shutdown.timeout_s``).

    Example::

        drain = Drain(batcher, checkpointer, processor, collective=False, timeout_s=10.0)
        drain.finish()   # the stop step
        drain.commit()
    """

    def __init__(
        self,
        batcher: MicroBatcher,
        checkpointer: Checkpointer,
        processor: BatchProcessor,
        collective: bool,
        timeout_s: float,
    ) -> None:
        self._batcher = batcher
        self._checkpointer = checkpointer
        self._processor = processor
        self._collective = collective
        self._timeout_s = timeout_s
        self.failed = False
        """Set by the loop after an error: a revocation while closing scores and commits
        nothing more (uncommitted work is left to the next run)."""

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
        """Wait for every acknowledgement (at most ``timeout_s``) and commit synchronously.

        Raises:
            DeliveryFailed: records were still unacknowledged (their offsets stay uncommitted).
        """
        self._checkpointer.flush_and_commit(self._timeout_s)

    def revoked(self, partitions: set[Partition]) -> int:
        """Partitions are being revoked (inside the revoke callback): finish and commit what
        they hold, or leave it to their next owner.

        Returns:
            How many decoded events of theirs were dropped, unscored.
        """
        if self.failed:
            return 0
        checkpointer, batcher = self._checkpointer, self._batcher
        if self._collective:
            self._processor.collect(wait=True)  # stepped together already; publishing is left
            dropped = batcher.drop_partitions(partitions)
            checkpointer.forget_open(list(partitions))
            checkpointer.commit_delivered()
            return dropped
        self.finish()
        dropped = batcher.drop_partitions(partitions)  # events waiting for the next batch
        checkpointer.flush_and_commit()
        return dropped

    def lost(self, partitions: set[Partition]) -> None:
        """Partitions already belong to someone else: forget their uncommitted offsets."""
        self._checkpointer.forget(list(partitions))
