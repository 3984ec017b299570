"""Backpressure: a full producer queue waits for room, and the input is paused instead of spinning.

librdkafka refuses a record when its local queue is full (``queue.buffering.max.messages``/
``kbytes``); the Kafka edge (:class:`~pipeline.connectors.kafka.producer.OutputProducer`) says
how many records of a batch it queued. :class:`BackpressuredProducer` then serves delivery
callbacks until the rest fits, and reports how long it has waited to the loop's
:class:`~pipeline.runtime.pausing.InputPause`, which pauses fetching once the wait is long
(:data:`~pipeline.runtime.pausing.PAUSE_AFTER_S`) and resumes when the records fit. The wait is
bounded: by the shutdown deadline once a stop was requested, and by ``max_block_s`` otherwise (then
:class:`~pipeline.stages.commit.DeliveryFailed`: nothing after the last acknowledged
checkpoint is committed, a restart replays it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pipeline.connectors.kafka.producer import OutputProducer
from pipeline.runtime.pausing import InputPause
from pipeline.types import Checkpoint, DeliveryFailed, Headers, Shutdown


class BackpressuredProducer:
    """The Kafka edge's producer, whose ``produce`` and ``produce_batch`` wait while the local
    queue is full (reporting the wait, so that the input is paused once it is long).

    Args:
        producer: the producer at the Kafka edge.
        pause: told how long the wait has lasted, and when it is over.
        shutdown: the run's stop request: once made, the wait ends by its deadline.
        max_block_s: longest wait for room without a shutdown.

    Example::

        producer = BackpressuredProducer(producer, InputPause(source), Shutdown(10.0))
        sink = RecommendationSink(producer, ...)
    """

    def __init__(
        self,
        producer: OutputProducer,
        pause: InputPause,
        shutdown: Shutdown,
        max_block_s: float = 300.0,
    ) -> None:
        self._producer = producer
        self._pause = pause
        self._shutdown = shutdown
        self._max_block_s = max_block_s
        self.waits = 0
        """Produce calls that found the queue full."""

    def use(self, producer: OutputProducer) -> None:
        """Produce through ``producer`` from now on (exactly-once replaced the one whose
        transactional call never came back)."""
        self._producer = producer

    @property
    def paused(self) -> bool:
        """Whether the input is paused now, for this wait (:attr:`InputPause.paused`)."""
        return self._pause.paused

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers | None,
        acks: Checkpoint,
    ) -> None:
        """Produce one record (counted into ``acks`` by the caller); waits (callbacks served,
        the wait reported) while the queue is full.

        Raises:
            DeliveryFailed: still no room at the deadline.
        """
        if self._producer.send_one(topic, value, key, headers, acks):
            return
        self._wait(lambda: self._producer.send_one(topic, value, key, headers, acks))

    def produce_batch(
        self, topic: str, values: list[bytes], keys: list[bytes], acks: Checkpoint
    ) -> None:
        """Produce records in order (counted into ``acks`` by the caller); waits (callbacks
        served, the wait reported) while the queue is full.

        Raises:
            DeliveryFailed: still no room at the deadline.
        """
        sent = self._producer.send(topic, values, keys, acks)
        if sent == len(values):
            return
        done = [sent]

        def more() -> bool:
            done[0] = self._producer.send(topic, values, keys, acks, done[0])
            return done[0] == len(values)

        self._wait(more)

    def _wait(self, attempt: Callable[[], bool]) -> None:
        """Serve callbacks and ``attempt`` again until it succeeds or the deadline passes."""
        self.waits += 1
        start = time.monotonic()
        give_up = start + self._max_block_s
        try:
            while True:
                self._producer.poll(0.05)
                if attempt():
                    return
                now = time.monotonic()
                stop_by = self._shutdown.deadline
                limit = give_up if stop_by is None else min(give_up, stop_by)
                if now >= limit:
                    raise DeliveryFailed("producer queue still full at the deadline")
                self._pause.producer_waiting(now - start)
        finally:
            self._pause.producer_room()

    def poll(self, timeout: float = 0) -> int:
        return self._producer.poll(timeout)

    def flush(self, timeout: float = 0) -> int:
        return self._producer.flush(timeout)
