"""Backpressure: a full producer queue pauses the input instead of spinning.

librdkafka raises ``BufferError`` when its local queue is full
(``queue.buffering.max.messages``/``kbytes``). :class:`BackpressuredProducer` then serves
delivery callbacks until the record fits; when that takes longer than :data:`PAUSE_AFTER_S` it
also pauses fetching of the assigned partitions
(:meth:`~pipeline.stages.source.KafkaSource.held_back`) until then, and resumes. The wait is
bounded: by the shutdown deadline once a stop was requested, and by ``max_block_s`` otherwise (then
:class:`~pipeline.stages.commit.DeliveryFailed`: nothing after the last acknowledged
checkpoint is committed, a restart replays it).
"""

from __future__ import annotations

import time
from contextlib import ExitStack

from pipeline.connectors.kafka.clients import DeliveryCallback, Headers, RecordProducer
from pipeline.stages.source import KafkaSource
from pipeline.types import DeliveryFailed, Shutdown

PAUSE_AFTER_S = 1.0
"""A full queue pauses the input only after this long: a paused partition drops its prefetched
messages and refetches them after the resume, which stalls delivery for ~0.6 s (BENCHMARKS.md),
far longer than a short wait for room."""


class BackpressuredProducer:
    """A :class:`~pipeline.connectors.kafka.clients.RecordProducer` whose ``produce`` waits while
    the local
    queue is full (with the input paused once the wait is long).

    Args:
        producer: the real producer.
        source: paused while waiting.
        shutdown: the run's stop request: once made, the wait ends by its deadline.
        max_block_s: longest wait for room without a shutdown.
        pause_after_s: how long a wait goes on before the input is paused.

    Example::

        sink = RecommendationSink(BackpressuredProducer(producer, source, Shutdown(10.0)), ...)
    """

    def __init__(
        self,
        producer: RecordProducer,
        source: KafkaSource,
        shutdown: Shutdown,
        max_block_s: float = 300.0,
        pause_after_s: float = PAUSE_AFTER_S,
    ) -> None:
        self._producer = producer
        self._source = source
        self._shutdown = shutdown
        self._max_block_s = max_block_s
        self._pause_after_s = pause_after_s
        self.waits = 0
        """Produce calls that found the queue full."""
        self.paused = False
        """Whether the input is paused now (a wait longer than :data:`PAUSE_AFTER_S`)."""

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        *,
        headers: Headers | None = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        """Produce one record; waits (input paused, callbacks served) while the queue is full.

        Raises:
            DeliveryFailed: still no room at the deadline.
        """
        try:
            self._producer.produce(topic, value, key, headers=headers, on_delivery=on_delivery)
            return
        except BufferError:
            self.waits += 1
        start = time.monotonic()
        give_up = start + self._max_block_s
        with ExitStack() as paused:
            paused.callback(setattr, self, "paused", False)
            while True:
                self._producer.poll(0.05)
                try:
                    self._producer.produce(
                        topic, value, key, headers=headers, on_delivery=on_delivery
                    )
                    return
                except BufferError:
                    now = time.monotonic()
                    stop_by = self._shutdown.deadline
                    limit = give_up if stop_by is None else min(give_up, stop_by)
                    if now >= limit:
                        raise DeliveryFailed("producer queue still full at the deadline") from None
                    if now - start >= self._pause_after_s and not self.paused:
                        paused.enter_context(self._source.held_back())
                        self.paused = True

    def poll(self, timeout: float = 0) -> int:
        return self._producer.poll(timeout)

    def flush(self, timeout: float = 0) -> int:
        return self._producer.flush(timeout)
