"""Source: messages from the input topic, the partitions this member owns, and its activity.

:class:`KafkaSource` wraps the consumer for the loop: it polls a bounded number of messages
into a backlog that the loop takes from in runs (to decode them together), keeps the assignment
the rebalance callbacks report (:mod:`pipeline.runtime.rebalance`), and remembers when input last
arrived (for ``--exit-when-idle``) and, per partition, the first offset taken since it was
assigned (so that :meth:`KafkaSource.rewind` can go back to where a run started it). Client
errors carried by messages are handled here: end-of-partition is ignored, a fatal error raises,
anything else is logged.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from pipeline.connectors.kafka.clients import RebalanceCallback, SubscribingConsumer

log = logging.getLogger(__name__)

Partition = tuple[str, int]
"""(topic, partition)."""


class KafkaSource:
    """The input topic as seen by one consumer-group member.

    Args:
        consumer: subscribed by :meth:`subscribe`; closed by :meth:`close`.
        topic: the input topic.
        max_messages: messages asked for per poll (``batching.consume_batch_size``).

    Example::

        source = KafkaSource(consumer, "user-events", max_messages=500)
        source.subscribe(handler.on_assign, handler.on_revoke, handler.on_lost)
        source.poll(0.1)                 # returns at once when messages are queued
        arrived = source.head_arrival    # when the oldest of them was consumed
        messages = source.take(500)
    """

    def __init__(self, consumer: SubscribingConsumer, topic: str, max_messages: int) -> None:
        self._consumer = consumer
        self.topic = topic
        """The input topic."""
        self._max_messages = max_messages
        self._backlog: deque[Message] = deque()
        self._arrivals: deque[tuple[int, float]] = deque()
        """(messages, monotonic time consumed) per poll still in the backlog, oldest first."""
        self._consumed_mono = self._consumed_wall = 0.0
        """The monotonic and wall clocks at the last poll that returned messages."""
        self.drained = True
        """Whether the last poll emptied the client's queue (it returned fewer than
        ``max_messages``): what is in the backlog is all there is for now."""
        self.assignment: set[Partition] = set()
        """Partitions this member owns now."""
        self.last_activity: float | None = None
        """Monotonic time of the last input or (re)assignment; ``None`` before the first."""
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
        on_assign: RebalanceCallback,
        on_revoke: RebalanceCallback,
        on_lost: RebalanceCallback,
    ) -> None:
        """Join the consumer group on the input topic with these rebalance callbacks."""
        self._consumer.subscribe(
            [self.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost
        )

    @property
    def backlog(self) -> int:
        """Messages polled and not yet taken."""
        return len(self._backlog)

    def poll(self, timeout_s: float) -> int:
        """Consume what is queued into the backlog, up to ``max_messages``; block (at most
        ``timeout_s``) only when nothing is queued (rebalance callbacks run in here).

        ``consume(n, timeout)`` returns only when ``n`` messages arrived or the timeout passed,
        even with messages queued; so the queue is drained without blocking first, and the
        blocking call asks for one message, which returns as soon as one arrives (then what
        came with it is drained too).

        Args:
            timeout_s: longest to wait when nothing is queued.

        Returns:
            How many messages arrived.
        """
        consumer, limit = self._consumer, self._max_messages
        messages = consumer.consume(limit, 0)
        if not messages and timeout_s > 0:
            messages = consumer.consume(1, timeout_s)
            if messages and limit > 1:
                messages.extend(consumer.consume(limit - 1, 0))
        self.drained = len(messages) < limit
        if messages:
            now = time.monotonic()
            self._consumed_mono, self._consumed_wall = now, time.time()
            self.last_activity = now
            if self.first_input_at is None:
                self.first_input_at = now
            self._backlog.extend(messages)
            self._arrivals.append((len(messages), now))
        return len(messages)

    @property
    def head_arrival(self) -> float | None:
        """When the message at the head of the backlog arrived, in monotonic time: its Kafka
        timestamp (producer or broker time) when that is earlier than when it was consumed (it
        queued in the client, e.g. during a forward), else when it was consumed. ``None``: the
        backlog is empty.

        A producer clock ahead of ours counts as consumed-now; one far behind makes events look
        old, so they are scored at once (never later than otherwise).
        """
        if not self._arrivals:
            return None
        consumed = self._arrivals[0][1]
        kind, stamp_ms = self._backlog[0].timestamp()
        if kind == TIMESTAMP_NOT_AVAILABLE or stamp_ms <= 0:
            return consumed
        queued_s = self._consumed_wall - stamp_ms / 1000 - (self._consumed_mono - consumed)
        return consumed - max(0.0, queued_s)

    def take(self, limit: int) -> list[Message]:
        """Up to ``limit`` data-carrying messages from the head of the backlog, in order.

        Raises:
            KafkaException: a message carried a fatal client error.
        """
        backlog = self._backlog
        out: list[Message] = []
        popped = 0
        while backlog and len(out) < limit:
            message = backlog.popleft()
            popped += 1
            err = message.error()
            if err is None:
                out.append(message)
            else:
                self._client_error(err)
        self._forget_arrivals(popped)
        if self._unstarted:
            self._note_starts(out)
        return out

    def _note_starts(self, messages: list[Message]) -> None:
        """The first offsets taken of partitions that had none yet (in poll order)."""
        unstarted = self._unstarted
        for message in messages:
            key, offset = (message.topic(), message.partition()), message.offset()
            if key in unstarted and offset is not None:
                self._starts[key] = offset
                unstarted.discard(key)
                if not unstarted:
                    return

    def _forget_arrivals(self, popped: int) -> None:
        """``popped`` messages left the head of the backlog."""
        arrivals = self._arrivals
        while popped and arrivals:
            count, at = arrivals[0]
            if count > popped:
                arrivals[0] = (count - popped, at)
                return
            arrivals.popleft()
            popped -= count

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
        self._paused -= partitions
        self._unstarted -= partitions
        for key in partitions:
            self._starts.pop(key, None)
        kept = deque(m for m in self._backlog if (m.topic(), m.partition()) not in partitions)
        dropped = len(self._backlog) - len(kept)
        if dropped:  # the arrival times of what is left: the oldest one stands for all
            at = self._arrivals[0][1] if self._arrivals else time.monotonic()
            self._arrivals = deque([(len(kept), at)] if kept else [])
        self._backlog = kept
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
        self._consumer.pause([TopicPartition(t, p) for t, p in new])
        self._paused.update(new)
        log.debug("paused %d partitions", len(new))
        return len(new)

    def resume(self) -> None:
        """Resume fetching of the paused partitions (those still assigned)."""
        partitions = sorted(self._paused & self.assignment)
        self._paused.clear()
        if partitions:
            self._consumer.resume([TopicPartition(t, p) for t, p in partitions])

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
        for message in self._backlog:
            key, offset = (message.topic(), message.partition()), message.offset()
            if message.error() is None and key in self.assignment and offset is not None:
                targets.setdefault(key, offset)
        targets.update({k: o for k, o in committed.items() if k in self.assignment})
        dropped = len(self._backlog)
        self._backlog.clear()
        self._arrivals.clear()
        for (topic, partition), offset in sorted(targets.items()):
            self._consumer.seek(TopicPartition(topic, partition, offset))
        log.info("rewound %d partitions to %s", len(targets), dict(sorted(targets.items())))
        return dropped

    def close(self) -> None:
        """Leave the group (commits are the checkpointer's; nothing is committed here)."""
        self._consumer.close()

    @staticmethod
    def _client_error(err: KafkaError) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if err.fatal():
            raise KafkaException(err)
        log.warning("consumer error: %s", err)
