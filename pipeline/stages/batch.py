"""Batch: decoded messages -> micro-batches bounded by rows and by delay.

Decoded messages wait in order (:meth:`MicroBatcher.queue`); :meth:`MicroBatcher.admit` moves
the events that fit into the open batch, with the rejected messages between them, and hands
those messages back for their offsets and dead letters. Nothing is decoded twice.

A batch closes when the next event would push it past ``max_batch_rows`` rows (rows are
event x candidate pairs; an event is never split), when it reaches ``max_batch_rows``, or when
its oldest event has waited ``max_delay_ms``, whichever comes first (when to score is decided by
:mod:`pipeline.runtime.stepping`, agreed across ranks). Memory in flight is bounded by
``max_batch_rows`` (plus one event) here and by the commit stage's in-flight limit after.
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from pipeline.types import DecodedMessages, EventColumns, Partition, PolledBatch

__all__ = ["MicroBatcher"]


class MicroBatcher:
    """Collects decoded events into batches bounded by rows and by delay.

    Args:
        max_batch_rows: rows (event x candidate) per batch.
        max_delay_ms: longest the oldest event waits.

    Example::

        batcher = MicroBatcher(max_batch_rows=4096, max_delay_ms=20)
        batcher.queue(decoder.decode(polled))
        admitted = batcher.admit()   # register its offsets, dead-letter its rejects
        if batcher.ready():
            events, messages = batcher.close()
    """

    def __init__(self, max_batch_rows: int, max_delay_ms: float) -> None:
        self.max_batch_rows = max_batch_rows
        self.max_delay_s = max_delay_ms / 1000
        self._parts: list[EventColumns] = []
        self._messages: list[PolledBatch] = []
        self._events = 0
        self._rows = 0
        self._oldest = 0.0
        self._complete = False
        self._waiting: list[DecodedMessages] = []
        self._arrivals: list[float] = []
        """Per entry of ``_waiting``: when its oldest message was consumed."""

    def queue(self, decoded: DecodedMessages, arrived: float | None = None) -> None:
        """Decoded messages, in consumption order, wait to join a batch.

        Args:
            decoded: the messages.
            arrived: monotonic time the oldest of them was consumed (default: now); a batch's
                delay counts from its first event's arrival.
        """
        if len(decoded):
            self._waiting.append(decoded)
            self._arrivals.append(time.monotonic() if arrived is None else arrived)

    @property
    def waiting(self) -> int:
        """Messages decoded and not admitted yet."""
        return sum(len(d) for d in self._waiting)

    def admit(self, row_cap: int | None = None) -> DecodedMessages | None:
        """Move the waiting events that fit into the open batch.

        Args:
            row_cap: close the batch at this many rows if fewer than ``max_batch_rows`` (a latency
                budget's cut: :mod:`pipeline.runtime.batch_policy`); the first event always fits.

        Returns:
            The messages admitted, in order: the events added and every rejected message
            before the first event that did not fit (their offsets now belong to the open
            batch; their rejects are to be dead-lettered). ``None`` when none was.
        """
        if not self._waiting:
            return None
        decoded, arrived = self._waiting[0], self._arrivals[0]
        if self._complete and decoded.events.num_events and decoded.event_message[0] == 0:
            return None  # an event waits first, and the batch takes none (no split to make)
        head, tail = decoded.split(self.room(decoded.events.candidate_counts, row_cap))
        if len(tail):
            self._waiting[0] = tail
        else:
            self._waiting.pop(0)
            self._arrivals.pop(0)
        if tail.events.num_events:
            self._complete = True  # the next event did not fit: it opens the next batch
        self.add(head.events, head.event_messages(), arrived)
        return head if len(head) else None

    def __len__(self) -> int:
        """Events in the open batch."""
        return self._events

    @property
    def rows(self) -> int:
        return self._rows

    def room(self, candidate_counts: npt.NDArray[np.int64], row_cap: int | None = None) -> int:
        """How many of the next events (their candidate counts, in order) fit the open batch.

        An empty batch takes at least one event (one event larger than ``max_batch_rows`` is a batch
        alone); an event is never split; a complete batch takes none.

        Args:
            candidate_counts: the next events' rows.
            row_cap: a smaller limit than ``max_batch_rows`` for this batch (``None``: none).
        """
        if self._complete:
            return 0
        limit = self.max_batch_rows if row_cap is None else min(self.max_batch_rows, row_cap)
        total = self._rows + np.cumsum(candidate_counts)
        fit = int(np.searchsorted(total, limit, side="right"))
        return max(fit, 1) if not self._events and len(candidate_counts) else fit

    def add(self, events: EventColumns, messages: PolledBatch, now: float | None = None) -> None:
        """Add events to the open batch (check :meth:`room` first).

        Args:
            events: decoded events, in consumption order.
            messages: per event, its source message.
            now: monotonic time the events were consumed (default: now).
        """
        if not events.num_events:
            return
        if not self._events:
            self._oldest = time.monotonic() if now is None else now
        self._parts.append(events)
        self._messages.append(messages)
        self._events += events.num_events
        self._rows += events.num_rows

    @property
    def is_complete(self) -> bool:
        """Whether the open batch takes no more events (the next one waits for the next)."""
        return self._complete

    def drop_partitions(self, partitions: set[Partition]) -> int:
        """Remove the events of ``partitions`` from the open batch and from the waiting ones.

        Returns:
            How many events were removed.
        """
        waiting = 0
        for i, decoded in enumerate(self._waiting):
            kept = decoded.without_partitions(partitions)
            waiting += decoded.events.num_events - kept.events.num_events
            self._waiting[i] = kept
        kept_arrivals = [a for d, a in zip(self._waiting, self._arrivals, strict=True) if len(d)]
        self._waiting = [d for d in self._waiting if len(d)]
        self._arrivals = kept_arrivals
        if not self._events:
            return waiting
        messages = PolledBatch.concat(self._messages)
        keep = ~messages.in_partitions(partitions)
        dropped = self._events - int(keep.sum())
        if dropped:
            rows = np.flatnonzero(keep)
            events = EventColumns.concat(self._parts).take(rows)
            self._parts = [events] if len(rows) else []
            self._messages = [messages.take(rows)] if len(rows) else []
            self._events = len(rows)
            self._rows = events.num_rows
            self._complete = False  # rows were freed: the next event may fit now
        return dropped + waiting

    @property
    def full(self) -> bool:
        return self._rows >= self.max_batch_rows

    def ready(self, now: float | None = None) -> bool:
        """Whether the open batch should be scored now: full, complete, or due."""
        return self.full or self._complete or self.due(now)

    @property
    def oldest(self) -> float | None:
        """Monotonic time the open batch's first event was consumed (``None``: empty)."""
        return self._oldest if self._events else None

    def time_left(self, now: float | None = None) -> float:
        """Seconds until the open batch is due (``inf`` when empty)."""
        if not self._events:
            return float("inf")
        now = time.monotonic() if now is None else now
        return max(0.0, self._oldest + self.max_delay_s - now)

    def due(self, now: float | None = None) -> bool:
        """Whether the oldest event has waited ``max_delay_ms``."""
        return bool(self._events) and self.time_left(now) <= 0.0

    def clear(self) -> int:
        """Drop the open batch and the waiting events (their outputs will not be published:
        an aborted transaction is consumed again). Returns how many events were dropped."""
        dropped = self._events + self.waiting
        self._parts, self._messages, self._events, self._rows = [], [], 0, 0
        self._complete = False
        self._waiting, self._arrivals = [], []
        return dropped

    def close(self) -> tuple[EventColumns, PolledBatch] | None:
        """Take the open batch: its events and their messages, one each (``None`` when
        empty)."""
        self._complete = False
        if not self._events:
            return None
        events, messages = EventColumns.concat(self._parts), PolledBatch.concat(self._messages)
        self._parts, self._messages, self._events, self._rows = [], [], 0, 0
        return events, messages
