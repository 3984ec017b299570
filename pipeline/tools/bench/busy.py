"""Co-located busy processes: a shared host, reproduced (``bench latency --busy-cores N``).

Each busy process is a fresh interpreter spinning in a loop, so it wants one core all the time,
like another tenant's CPU-bound job on the same host. They are not pinned: the scheduler places
them as it would another tenant's process. They are started and ended by their pids (SIGTERM,
then SIGKILL after ``stop_timeout_s``), never by name.

Example::

    with BusyProcesses(1) as busy:
        ...              # measure beside one busy core
        busy.pids        # {"busy-1": 12345}
"""

from __future__ import annotations

import subprocess
import sys

__all__ = ["BUSY_LOOP", "BusyProcesses"]

BUSY_LOOP = "while True:\n    pass\n"
"""What each busy process runs: one core's worth of pure CPU, no I/O, no memory traffic."""


class BusyProcesses:
    """``count`` busy processes for the duration of a ``with`` block.

    Args:
        count: how many (0: none; the block runs on a quiet host).
        stop_timeout_s: how long each may take to end after SIGTERM before it is killed.
    """

    def __init__(self, count: int, stop_timeout_s: float = 5.0) -> None:
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self.count = count
        self.stop_timeout_s = stop_timeout_s
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> dict[str, int]:
        """The running busy processes by name (``busy-1``, ``busy-2``...)."""
        return {f"busy-{i + 1}": p.pid for i, p in enumerate(self._processes)}

    def __enter__(self) -> BusyProcesses:
        try:
            for _ in range(self.count):
                self._processes.append(
                    subprocess.Popen(
                        [sys.executable, "-c", BUSY_LOOP],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                    )
                )
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """End every busy process this object started, by its pid."""
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
