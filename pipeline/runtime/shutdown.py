"""A requested stop and its deadline, shared by the loop and every wait below it.

The loop, a signal handler or a test calls :meth:`Shutdown.request`; waits further down (the
producer's full queue, acknowledgements, transactions) read :attr:`Shutdown.deadline` and end
by it. A passive record: nothing here calls anyone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["Shutdown"]


class Shutdown:
    """Whether a stop was asked for, and by when every wait must end.

    Args:
        timeout_s: from the request to the deadline (``shutdown.timeout_s``).
        clock: monotonic seconds (tests pass a fake one, shared with the waits they drive).

    Example::

        shutdown = Shutdown(10.0)
        shutdown.request()          # e.g. from a SIGTERM handler
        shutdown.deadline           # time.monotonic() + 10 at the first request
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._requested = threading.Event()
        self._deadline: float | None = None

    def request(self) -> None:
        """Ask for a stop (thread and signal safe); the first request sets the deadline."""
        if not self._requested.is_set():
            self._deadline = self._clock() + self.timeout_s
        self._requested.set()

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    @property
    def deadline(self) -> float | None:
        """``time.monotonic()`` by which every wait must end; ``None`` before a request."""
        return self._deadline
