"""Rebalance handling: what this member does when the group moves partitions.

The consumer calls these from inside ``consume()`` (librdkafka's rebalance callbacks), so a
revocation is handled before the partitions move: offsets of everything already delivered are
committed synchronously, and nothing of a revoked partition is scored after it.

- **assigned**: the source starts counting activity again.
- **revoked**: polled messages of the revoked partitions not yet in a batch are dropped (never
  registered for commit, so the next owner consumes them). A single process then scores its
  open batch (:meth:`~pipeline.runtime.processor.BatchProcessor.process`) and commits everything, so
  the handover repeats nothing. A rank of a sharded model cannot run a forward alone (it is a
  collective), so it drops the revoked partitions' events from its open batch instead and
  commits what is delivered; the new owner scores them (at-least-once).
- **lost**: the partitions already belong to someone else; their uncommitted offsets are
  forgotten (results may repeat, commits would fail).
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import TopicPartition

from pipeline.runtime.processor import BatchProcessor
from pipeline.stages.batch import MicroBatcher
from pipeline.stages.commit import Checkpointer
from pipeline.stages.source import KafkaSource, Partition
from pipeline.types import Batch

log = logging.getLogger(__name__)


def _partitions(partitions: list[TopicPartition]) -> set[Partition]:
    return {(p.topic, p.partition) for p in partitions}


class RebalanceHandler:
    """The consumer's rebalance callbacks for one scoring loop.

    Args:
        source: keeps the assignment and the polled backlog.
        batcher: the open batch (and the decoded events waiting for the next one).
        checkpointer: the commit protocol.
        processor: scores and publishes batches (and the one in flight).
        collective: ranks of a sharded model (forwards only together).

    Example::

        handler = RebalanceHandler(source, batcher, checkpointer, processor, collective=False)
        source.subscribe(handler.on_assign, handler.on_revoke, handler.on_lost)
    """

    def __init__(
        self,
        source: KafkaSource,
        batcher: MicroBatcher,
        checkpointer: Checkpointer,
        processor: BatchProcessor,
        collective: bool,
    ) -> None:
        self._source = source
        self._batcher = batcher
        self._checkpointer = checkpointer
        self._processor = processor
        self._collective = collective
        self.failed = False
        """Set by the loop after an error: a revocation while closing scores and commits
        nothing more (uncommitted work is left to the next run)."""

    def on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        assigned = _partitions(partitions)
        log.info("assigned %s", sorted(assigned))
        self._source.assigned(assigned)

    def on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        revoked = _partitions(partitions)
        log.info("revoked %s", sorted(revoked))
        dropped = self._source.revoked(revoked)
        if self.failed:
            return
        checkpointer, batcher = self._checkpointer, self._batcher
        if self._collective:
            self._processor.collect(wait=True)  # stepped together already; publishing is left
            dropped += batcher.drop_partitions(revoked)
            checkpointer.forget_open(list(revoked))
            checkpointer.commit_delivered()
        else:
            closed = batcher.close()
            if closed is not None:
                self._processor.process(Batch(*closed, checkpointer.cut()))
            self._processor.collect(wait=True)
            dropped += batcher.drop_partitions(revoked)  # events waiting for the next batch
            checkpointer.flush_and_commit()
        if dropped:
            log.info("left %d unscored events of revoked partitions to their next owner", dropped)

    def on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        lost = _partitions(partitions)
        log.warning("lost %s", sorted(lost))
        self._source.revoked(lost)
        self._checkpointer.forget(list(lost))
