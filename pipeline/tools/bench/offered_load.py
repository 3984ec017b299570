"""A steady offered rate from a separate producer process (``streamrank bench latency``).

The producer runs in its own process (a fresh interpreter), so its CPU is not the
pipeline's and its schedule does not wait on the pipeline's loop. It samples all its events
first, says it is ready, waits until the pipeline's consumer group owns the input topic, then
sends on a fixed schedule: every ``tick_s`` it sends, in one small burst, the events due by
then (``rate * elapsed``). Each event's ``event_time`` is stamped as it is sent.

Example::

    offer = OfferedLoad.start(OfferPlan(settings, rate=700.0, seconds=20.0))
    offer.wait_ready(120)
    ...  # run the pipeline
    sent = offer.result(60)
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np
import numpy.typing as npt

from pipeline.settings.loading import Settings, picklable


class Pacer:
    """Releases events on a fixed schedule: by tick k, ``floor(rate * k * tick_s)`` in all.

    A late wake-up (a loaded machine) releases the events it owes at once, so the offered rate
    holds on average; :attr:`max_late_s` says how late the worst wake-up was.

    Args:
        rate: events per second.
        tick_s: time between two bursts.
        clock: monotonic seconds (tests pass a fake).
        sleep: sleeps (tests pass a fake).

    Example::

        pacer = Pacer(rate=500.0, tick_s=0.002)
        pacer.start()
        while sent < total:
            sent += send(pacer.next_burst())
    """

    def __init__(
        self,
        rate: float,
        tick_s: float = 0.002,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if rate <= 0 or tick_s <= 0:
            raise ValueError(f"rate and tick_s must be > 0, got {rate}, {tick_s}")
        self.rate = rate
        self.tick_s = tick_s
        self._clock = clock
        self._sleep = sleep
        self._start = 0.0
        self._ticks = 0
        self._released = 0
        self.max_late_s = 0.0

    def start(self) -> None:
        """The schedule starts now (nothing is due yet)."""
        self._start = self._clock()
        self._ticks = 0
        self._released = 0
        self.max_late_s = 0.0

    def next_burst(self) -> int:
        """Sleep until the next tick; return how many events are due now and not yet released."""
        self._ticks += 1
        wake = self._start + self._ticks * self.tick_s
        delay = wake - self._clock()
        if delay > 0:
            self._sleep(delay)
        now = self._clock()
        self.max_late_s = max(self.max_late_s, now - wake)
        due = math.floor(self.rate * (now - self._start) + 1e-9) - self._released  # fp noise
        self._released += due
        return due


@dataclass(frozen=True)
class OfferPlan:
    """What the producer process sends.

    Attributes:
        settings: cluster, input topic, framing, synthetic world; ``kafka.group_id`` is the
            group to wait for.
        rate: events per second.
        seconds: how long to send (``ceil(rate * seconds)`` events).
        seed: event sampling seed.
        group_timeout_s: longest to wait for the group to own the input topic.
        tick_s: time between two bursts.
    """

    settings: Settings
    rate: float
    seconds: float
    seed: int = 0
    group_timeout_s: float = 120.0
    tick_s: float = 0.002

    @property
    def events(self) -> int:
        return max(1, math.ceil(self.rate * self.seconds))


@dataclass
class OfferedEvents:
    """What the producer process sent.

    Attributes:
        event_ids: in sending order.
        event_time_ms: int64, each event's ``event_time`` (wall clock when it was sent).
        candidates: int64, each event's candidate count (its rows).
        seconds: from the first send to the last.
        max_late_ms: the latest a burst left after its scheduled time.
    """

    event_ids: list[str]
    event_time_ms: npt.NDArray[np.int64]
    candidates: npt.NDArray[np.int64]
    seconds: float
    max_late_ms: float

    @property
    def sent(self) -> int:
        return len(self.event_ids)

    @property
    def achieved_rate(self) -> float:
        """Events per second actually sent (first to last send)."""
        return (self.sent - 1) / self.seconds if self.seconds > 0 and self.sent > 1 else 0.0


def offer_events(plan: OfferPlan, conn: Connection) -> None:
    """The producer process: sample, say ``"ready"``, wait for the group, send, report.

    Sends on ``conn``: ``"ready"``, then an :class:`OfferedEvents`, or a ``str`` (the error)
    instead of either.
    """
    try:
        conn.send(_send(plan, conn))
    except BaseException:
        conn.send(traceback.format_exc())
    finally:
        conn.close()


def _send(plan: OfferPlan, conn: Connection) -> OfferedEvents:
    from pipeline.connectors.kafka.clients import make_producer, produce
    from pipeline.tools.bench.event_source import event_records
    from pipeline.tools.consumer_group import wait_for_assignment

    settings, total = plan.settings, plan.events
    source = event_records(settings, total, plan.seed)  # the world's, or [model.module]'s
    records = source.records
    producer = make_producer(settings.kafka.config)
    keys = [source.key(r) for r in records]
    times = np.zeros(total, dtype=np.int64)
    conn.send("ready")
    wait_for_assignment(
        settings.kafka, settings.kafka.group_id, settings.topics.input, plan.group_timeout_s
    )
    topic = settings.topics.input
    pacer = Pacer(plan.rate, plan.tick_s)
    pacer.start()
    first = time.monotonic()
    sent = 0
    while sent < total:
        burst = min(pacer.next_burst(), total - sent)
        for i in range(sent, sent + burst):
            times[i] = int(time.time() * 1000)
            source.stamp(records[i], int(times[i]))
            produce(producer, topic, source.encode(records[i]), key=keys[i])
        sent += burst
        producer.poll(0)
    seconds = time.monotonic() - first
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} events not delivered to {topic}")
    return OfferedEvents(
        event_ids=[source.event_id(r) for r in records],
        event_time_ms=times,
        candidates=np.array([source.candidates(r) for r in records], dtype=np.int64),
        seconds=seconds,
        max_late_ms=pacer.max_late_s * 1000,
    )


class OfferedLoad:
    """The parent's handle on a producer process (see the module docstring)."""

    def __init__(self, process: subprocess.Popen[bytes], conn: Connection) -> None:
        self._process = process
        self._conn = conn

    @classmethod
    def start(cls, plan: OfferPlan) -> OfferedLoad:
        """Start the producer process: a fresh interpreter that shares no state with this one.

        The plan goes in pickled on its stdin; its messages come back on a pipe of their own.
        (A plain subprocess, not ``multiprocessing``: no resource-tracker process left behind,
        no ``__main__`` guard needed in a script that calls this.)
        """
        receive_fd, send_fd = os.pipe()
        command = [sys.executable, "-m", "pipeline.tools.bench.offered_load", str(send_fd)]
        try:
            process = subprocess.Popen(command, stdin=subprocess.PIPE, pass_fds=(send_fd,))
        finally:
            os.close(send_fd)
        assert process.stdin is not None
        with process.stdin:  # the settings of a config file as a plain, picklable Settings
            plan = dataclasses.replace(plan, settings=picklable(plan.settings))
            process.stdin.write(pickle.dumps(plan))
        return cls(process, Connection(receive_fd, writable=False))

    @property
    def pid(self) -> int:
        """The producer process's pid."""
        return self._process.pid

    def _receive(self, timeout_s: float) -> object:
        try:
            if not self._conn.poll(timeout_s):
                raise TimeoutError(f"the producer process said nothing for {timeout_s:g}s")
            message = self._conn.recv()
        except EOFError:
            code = self._process.wait(10)
            raise RuntimeError(
                f"the producer process ended (exit code {code}) without reporting "
                "(its traceback is on stderr)"
            ) from None
        if isinstance(message, str) and message != "ready":
            raise RuntimeError(f"the producer process failed:\n{message}")
        return message

    def wait_ready(self, timeout_s: float) -> None:
        """Until the producer has sampled its events and waits for the group."""
        self._receive(timeout_s)

    def result(self, timeout_s: float) -> OfferedEvents:
        """What it sent (after its last event is acknowledged)."""
        sent = self._receive(timeout_s)
        assert isinstance(sent, OfferedEvents)
        self._process.wait(10)
        return sent

    def close(self) -> None:
        """End the process if it still runs (after an error on either side)."""
        if self._process.poll() is None:
            self._process.terminate()
            self._process.wait(10)
        self._conn.close()


if __name__ == "__main__":  # the producer process (OfferedLoad.start)
    # Through the module's import name, so that what it sends unpickles as
    # pipeline.tools.bench.offered_load.OfferedEvents, not __main__.OfferedEvents.
    from pipeline.tools.bench import offered_load

    offered_load.offer_events(
        pickle.load(sys.stdin.buffer), Connection(int(sys.argv[1]), readable=False)
    )
