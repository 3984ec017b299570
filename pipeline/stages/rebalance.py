"""Rebalance handling: what this member does when the group moves partitions.

The consumer calls these from inside ``consume()`` (librdkafka's rebalance callbacks), so a
revocation is handled before the partitions move: offsets of everything already delivered are
committed synchronously, and nothing of a revoked partition is scored after it.

- **assigned**: the source starts counting activity again.
- **revoked**: polled-but-unfed messages of the revoked partitions are dropped (never
  registered for commit, so the next owner consumes them). A single process then scores its
  open batch and commits everything, so the handover repeats nothing. A rank of a sharded model
  cannot run a forward alone (it is a collective), so it drops the revoked partitions' events
  from its open batch instead and commits what is delivered; the new owner scores them
  (at-least-once).
- **lost**: the partitions already belong to someone else; their uncommitted offsets are
  forgotten (results may repeat, commits would fail).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from pipeline.stages.batch import MicroBatcher
from pipeline.stages.commit import Checkpointer
from pipeline.stages.score import ForwardExecutor
from pipeline.stages.source import KafkaSource, Partition

log = logging.getLogger(__name__)


def _partitions(partitions: list[TopicPartition]) -> set[Partition]:
    return {(p.topic, p.partition) for p in partitions}


class RebalanceHandler:
    """The consumer's rebalance callbacks for one scoring loop.

    Args:
        source: keeps the assignment and the polled backlog.
        batcher: the open batch (and the event held for the next one).
        checkpointer: the commit protocol.
        executor: the forward in flight.
        score_open_batch: scores and publishes the open batch now (single process only).
        collective: ranks of a sharded model (forwards only together).

    Example::

        handler = RebalanceHandler(source, batcher, checkpointer, executor, score, False)
        source.subscribe(handler.on_assign, handler.on_revoke, handler.on_lost)
    """

    def __init__(
        self,
        source: KafkaSource,
        batcher: MicroBatcher,
        checkpointer: Checkpointer,
        executor: ForwardExecutor,
        score_open_batch: Callable[[], None],
        collective: bool,
    ) -> None:
        self._source = source
        self._batcher = batcher
        self._checkpointer = checkpointer
        self._executor = executor
        self._score_open_batch = score_open_batch
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
        checkpointer = self._checkpointer
        if self._collective:
            self._executor.finish()  # already stepped together; only publishing is left
            dropped += self._batcher.drop_partitions(revoked)
            checkpointer.forget_open(list(revoked))
            checkpointer.commit_delivered()
        else:
            self._score_open_batch()
            self._executor.finish()
            dropped += self._batcher.drop_partitions(revoked)  # the held event, if any
            checkpointer.flush_and_commit()
        if dropped:
            log.info("left %d unscored events of revoked partitions to their next owner", dropped)

    def on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        lost = _partitions(partitions)
        log.warning("lost %s", sorted(lost))
        self._source.revoked(lost)
        self._checkpointer.forget(list(lost))
