"""Pausing the input: one owner decides when the source stops fetching.

The loop builds one :class:`InputPause` per run over its source. What may pause the input
reports to it; only it pauses and resumes:

- **a full producer queue** (:class:`~pipeline.runtime.backpressure.BackpressuredProducer`
  reports how long it has been waiting for room, then that it has room again): a wait longer
  than :data:`PAUSE_AFTER_S` pauses fetching of the assigned partitions until there is room.
- **a drain waiting for its group** (:mod:`pipeline.runtime.drain`): while it polls for the
  group to settle, every partition is paused, those assigned meanwhile included, for good.

The pause itself is the source's (:meth:`~pipeline.stages.source.KafkaSource.pause`).
"""

from __future__ import annotations

from pipeline.stages.source import KafkaSource

PAUSE_AFTER_S = 1.0
"""A full queue pauses the input only after this long: a paused partition drops its prefetched
messages and refetches them after the resume, which stalls delivery for ~0.6 s (BENCHMARKS.md),
far longer than a short wait for room."""


class InputPause:
    """Pauses and resumes the source on what it is told (see the module docstring).

    Args:
        source: the input.
        pause_after_s: how long the producer waits for room before the input is paused.

    Example::

        pause = InputPause(source)
        pause.producer_waiting(waited_s=1.5)   # paused
        pause.producer_room()                  # resumed
    """

    def __init__(self, source: KafkaSource, pause_after_s: float = PAUSE_AFTER_S) -> None:
        self._source = source
        self._pause_after_s = pause_after_s
        self._held_for_good = False
        self.paused = False
        """Whether the input is paused now for a full producer queue."""

    def producer_waiting(self, waited_s: float) -> None:
        """The producer has been waiting ``waited_s`` for room in its queue."""
        if waited_s >= self._pause_after_s and not self.paused:
            self._source.pause()
            self.paused = True

    def producer_room(self) -> None:
        """The producer's wait is over (the record fit, or it gave up)."""
        if self.paused:
            self.paused = False
            if not self._held_for_good:
                self._source.resume()

    def hold_everything(self) -> None:
        """Pause every assigned partition, and keep them paused (a drain: call again after a
        rebalance, for the partitions assigned since)."""
        self._held_for_good = True
        self._source.pause()
