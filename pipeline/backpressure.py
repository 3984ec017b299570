"""Backpressure: a full producer queue pauses the input instead of spinning.

librdkafka raises ``BufferError`` when its local queue is full
(``queue.buffering.max.messages``/``kbytes``). :class:`BackpressuredProducer` then pauses
fetching of the assigned partitions (:meth:`~pipeline.stages.source.KafkaSource.held_back`),
serves delivery callbacks until the record fits, and resumes. The wait is bounded: by the
shutdown deadline once a stop was requested, and by ``max_block_s`` otherwise (then
:class:`~pipeline.stages.commit.DeliveryFailed`: nothing after the last acknowledged
checkpoint is committed, a restart replays it).
"""

from __future__ import annotations

import time

from pipeline.kafka_io import DeliveryCallback, Headers, RecordProducer
from pipeline.records import DeliveryFailed
from pipeline.shutdown import Shutdown
from pipeline.stages.source import KafkaSource


class BackpressuredProducer:
    """A :class:`~pipeline.kafka_io.RecordProducer` whose ``produce`` waits, with the input
    paused, while the local queue is full.

    Args:
        producer: the real producer.
        source: paused while waiting.
        shutdown: the run's stop request: once made, the wait ends by its deadline.
        max_block_s: longest wait for room without a shutdown.

    Example::

        sink = RecommendationSink(BackpressuredProducer(producer, source, Shutdown(10.0)), ...)
    """

    def __init__(
        self,
        producer: RecordProducer,
        source: KafkaSource,
        shutdown: Shutdown,
        max_block_s: float = 300.0,
    ) -> None:
        self._producer = producer
        self._source = source
        self._shutdown = shutdown
        self._max_block_s = max_block_s
        self.waits = 0
        """Produce calls that found the queue full."""

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
        give_up = time.monotonic() + self._max_block_s
        with self._source.held_back():
            while True:
                self._producer.poll(0.05)
                try:
                    self._producer.produce(
                        topic, value, key, headers=headers, on_delivery=on_delivery
                    )
                    return
                except BufferError:
                    stop_by = self._shutdown.deadline
                    limit = give_up if stop_by is None else min(give_up, stop_by)
                    if time.monotonic() >= limit:
                        raise DeliveryFailed("producer queue still full at the deadline") from None

    def poll(self, timeout: float = 0) -> int:
        return self._producer.poll(timeout)

    def flush(self, timeout: float = 0) -> int:
        return self._producer.flush(timeout)
