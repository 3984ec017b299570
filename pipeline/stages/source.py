"""Source: messages from the input topic, the partitions this member owns, and its activity.

:class:`KafkaSource` wraps the consumer for the loop: it polls a bounded number of messages
into a backlog of :class:`~pipeline.types.PolledBatch` (one per poll, made by the Kafka edge,
:class:`~pipeline.connectors.kafka.consumer.InputConsumer`) that the loop takes from in runs (to
decode them together), keeps the assignment the rebalance callbacks report
(:mod:`pipeline.runtime.rebalance`), and remembers when input last arrived (for
``--exit-when-idle``) and, per partition, the first offset taken since it was assigned (so that
:meth:`KafkaSource.rewind` can go back to where a run started it). Client errors are the edge's:
end-of-partition is ignored, a fatal error raises, anything else is logged.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np

from pipeline.connectors.kafka.consumer import InputConsumer, PartitionsCallback
from pipeline.types import Partition, PolledBatch

log = logging.getLogger(__name__)

__all__ = ["KafkaSource", "Partition"]


class KafkaSource:
    """The input topic as seen by one consumer-group member.

    Args:
        consumer: the consumer at the Kafka edge; subscribed by :meth:`subscribe`, closed by
            :meth:`close`.
        topic: the input topic.
        max_messages: messages asked for per poll (``batching.consume_batch_size``).

    Example::

        source = KafkaSource(consumer, "user-events", max_messages=500)
        source.subscribe(handler.on_assign, handler.on_revoke, handler.on_lost)
        source.poll(0.1)                 # returns at once when messages are queued
        arrived = source.head_arrival    # when the oldest of them was consumed
        messages = source.take(500)      # a PolledBatch
    """

    def __init__(self, consumer: InputConsumer, topic: str, max_messages: int) -> None:
        self._consumer = consumer
        self.topic = topic
        """The input topic."""
        self._max_messages = max_messages
        self._backlog: deque[tuple[PolledBatch, float]] = deque()
        """Polled messages not taken yet, one entry per poll (what is left of it), oldest first,
        with the monotonic time it was consumed."""
        self._backlog_count = 0
        self._consumed_mono = self._consumed_wall = 0.0
        """The monotonic and wall clocks at the last poll that returned messages."""
        self.drained = True
        """Whether the last poll emptied the client's queue (it returned fewer than
        ``max_messages``): what is in the backlog is all there is for now."""
        self.assignment: set[Partition] = set()
        """Partitions this member owns now."""
        self.last_activity: float | None = None
        """Monotonic time of the last input or change of assignment (partitions assigned,
        revoked or lost: the member is in a rebalance, or rejoining after a broker outage, not
        idle); ``None`` before the first."""
        self.first_input_at: float | None = None
        """Monotonic time the first message arrived."""
        self.pauses = 0
        """Times fetching was paused (:meth:`pause` while nothing was paused)."""
        self._paused: set[Partition] = set()
        self._starts: dict[Partition, int] = {}
        """Per assigned partition, the first offset taken since its assignment."""
        self._unstarted: set[Partition] = set()
        """Assigned partitions nothing was taken of yet."""

    def subscribe(
        self,
        on_assign: PartitionsCallback,
        on_revoke: PartitionsCallback,
        on_lost: PartitionsCallback,
    ) -> None:
        """Join the consumer group on the input topic with these rebalance callbacks."""
        self._consumer.subscribe(self.topic, on_assign, on_revoke, on_lost)

    @property
    def backlog(self) -> int:
        """Messages polled and not yet taken."""
        return self._backlog_count

    def poll(self, timeout_s: float) -> int:
        """Consume what is queued into the backlog, up to ``max_messages``; block (at most
        ``timeout_s``) only when nothing is queued (rebalance callbacks run in here;
        :meth:`~pipeline.connectors.kafka.consumer.InputConsumer.consume`).

        Args:
            timeout_s: longest to wait when nothing is queued.

        Returns:
            How many messages arrived.

        Raises:
            KafkaClientError: a fatal client error.
        """
        polled = self._consumer.consume(self._max_messages, timeout_s)
        count = len(polled)
        self.drained = count < self._max_messages
        if count:
            now = time.monotonic()
            self._consumed_mono, self._consumed_wall = now, time.time()
            self.last_activity = now
            if self.first_input_at is None:
                self.first_input_at = now
            self._backlog.append((polled, now))
            self._backlog_count += count
        return count

    @property
    def head_arrival(self) -> float | None:
        """When the message at the head of the backlog arrived, in monotonic time: its Kafka
        timestamp (producer or broker time) when that is earlier than when it was consumed (it
        queued in the client, e.g. during a forward), else when it was consumed. ``None``: the
        backlog is empty.

        A producer clock ahead of ours counts as consumed-now; one far behind makes events look
        old, so they are scored at once (never later than otherwise).
        """
        if not self._backlog:
            return None
        polled, consumed = self._backlog[0]
        stamp_ms = int(polled.timestamps_ms[0])
        if stamp_ms <= 0:
            return consumed
        queued_s = self._consumed_wall - stamp_ms / 1000 - (self._consumed_mono - consumed)
        return consumed - max(0.0, queued_s)

    def take(self, limit: int) -> PolledBatch:
        """Up to ``limit`` messages from the head of the backlog, in order."""
        backlog = self._backlog
        parts: list[PolledBatch] = []
        wanted = limit
        while backlog and wanted > 0:
            polled, at = backlog[0]
            if len(polled) > wanted:
                parts.append(polled.slice(0, wanted))
                backlog[0] = (polled.slice(wanted), at)
                wanted = 0
                break
            parts.append(polled)
            backlog.popleft()
            wanted -= len(polled)
        if not parts:
            return PolledBatch.empty(self.topic)
        taken = PolledBatch.concat(parts)
        self._backlog_count -= len(taken)
        if self._unstarted:
            self._note_starts(taken)
        return taken

    def _note_starts(self, taken: PolledBatch) -> None:
        """The first offsets taken of partitions that had none yet (in poll order)."""
        numbers, first = np.unique(taken.partitions, return_index=True)
        for number, index in zip(numbers.tolist(), first.tolist(), strict=True):
            key = (self.topic, number)
            if key in self._unstarted:
                self._starts[key] = int(taken.offsets[index])
                self._unstarted.discard(key)

    def assigned(self, partitions: set[Partition]) -> None:
        """Partitions were added to this member (incremental, cooperative-sticky)."""
        self.assignment |= partitions
        self.last_activity = time.monotonic()
        for key in partitions:
            self._starts.pop(key, None)
        self._unstarted |= partitions

    def revoked(self, partitions: set[Partition]) -> int:
        """Partitions left this member: drop their polled messages (never registered for commit;
        the next owner consumes them again).

        Returns:
            How many messages were dropped.
        """
        self.assignment -= partitions
        self.last_activity = time.monotonic()
        self._paused -= partitions
        self._unstarted -= partitions
        for key in partitions:
            self._starts.pop(key, None)
        kept: deque[tuple[PolledBatch, float]] = deque()
        for polled, at in self._backlog:
            left = polled.where(~polled.in_partitions(partitions))
            if len(left):
                kept.append((left, at))
        count = sum(len(polled) for polled, _ in kept)
        dropped = self._backlog_count - count
        self._backlog, self._backlog_count = kept, count
        return dropped

    def pause(self) -> int:
        """Pause fetching of every assigned partition not paused yet (the loop's
        :class:`~pipeline.runtime.pausing.InputPause` decides when).

        Returns:
            How many partitions were paused now.
        """
        new = sorted(self.assignment - self._paused)
        if not new:
            return 0
        if not self._paused:
            self.pauses += 1
        self._consumer.pause(new)
        self._paused.update(new)
        log.debug("paused %d partitions", len(new))
        return len(new)

    def resume(self) -> None:
        """Resume fetching of the paused partitions (those still assigned)."""
        partitions = sorted(self._paused & self.assignment)
        self._paused.clear()
        if partitions:
            self._consumer.resume(partitions)

    def rewind(self, committed: dict[Partition, int]) -> int:
        """Drop the polled backlog and seek every assigned partition back: to its ``committed``
        offset, else to the first offset taken since it was assigned (or, when none was
        taken, the first one polled). Partitions nothing was polled of keep their position.

        Args:
            committed: the offsets last committed, per partition (this run's commits).

        Returns:
            How many polled messages were dropped.
        """
        targets = {key: offset for key, offset in self._starts.items() if key in self.assignment}
        for polled, _ in self._backlog:
            numbers, first = np.unique(polled.partitions, return_index=True)
            for number, index in zip(numbers.tolist(), first.tolist(), strict=True):
                key = (polled.topic, number)
                if key in self.assignment:
                    targets.setdefault(key, int(polled.offsets[index]))
        targets.update({k: o for k, o in committed.items() if k in self.assignment})
        dropped = self._backlog_count
        self._backlog.clear()
        self._backlog_count = 0
        for partition, offset in sorted(targets.items()):
            self._consumer.seek(partition, offset)
        log.info("rewound %d partitions to %s", len(targets), dict(sorted(targets.items())))
        return dropped

    def close(self) -> None:
        """Leave the group (commits are the checkpointer's; nothing is committed here)."""
        self._consumer.close()
