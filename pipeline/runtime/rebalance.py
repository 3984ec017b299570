"""Rebalance handling: what this member does when the group moves partitions.

The consumer calls these from inside ``consume()`` (librdkafka's rebalance callbacks, which the
Kafka edge hands the partitions to as ``(topic, partition)`` pairs), so a revocation is handled
before the partitions move: what the loop has open for them is finished
and committed by the loop's own drain (:meth:`pipeline.runtime.drain.Drain.revoked`), and
nothing of a revoked partition is scored after it.

- **assigned**: the source starts counting activity again.
- **revoked**: polled messages of the revoked partitions not yet decoded are dropped (never
  registered for commit, so the next owner consumes them); then the drain finishes and commits.
- **lost**: the partitions already belong to someone else; their uncommitted offsets are
  forgotten (results may repeat, commits would fail).
"""

from __future__ import annotations

import logging

from pipeline.runtime.drain import Drain
from pipeline.stages.source import KafkaSource, Partition

log = logging.getLogger(__name__)


class RebalanceHandler:
    """The consumer's rebalance callbacks for one scoring loop.

    Args:
        source: keeps the assignment and the polled backlog.
        drain: the loop's finish, publish and commit.

    Example::

        handler = RebalanceHandler(source, drain)
        source.subscribe(handler.on_assign, handler.on_revoke, handler.on_lost)
    """

    def __init__(self, source: KafkaSource, drain: Drain) -> None:
        self._source = source
        self._drain = drain

    def on_assign(self, assigned: set[Partition]) -> None:
        log.info("assigned %s", sorted(assigned))
        self._source.assigned(assigned)

    def on_revoke(self, revoked: set[Partition]) -> None:
        log.info("revoked %s", sorted(revoked))
        dropped = self._source.revoked(revoked)
        dropped += self._drain.revoked(revoked)
        if dropped:
            log.info("left %d unscored events of revoked partitions to their next owner", dropped)

    def on_lost(self, lost: set[Partition]) -> None:
        log.warning("lost %s", sorted(lost))
        self._source.revoked(lost)
        self._drain.lost(lost)
