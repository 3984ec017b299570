"""Where a drain's CPU goes: each thread of this process and each process of the stack, from
``/proc``.

A :class:`CpuAccount` samples, every ``every_s`` on a thread of its own, the user + system CPU
time of every thread of this process (``/proc/self/task/<tid>/stat``) and of the other
processes named (the Kafka broker and Redis, found by the port they listen on:
:func:`listening_pid`). Each thread is charged what it used between its first and last sample
(a thread born during the account starts from 0). Threads are grouped by role:

- ``loop``: the thread that opened the account (the pipeline's loop, which also runs a CPU
  model's forward when nothing overlaps);
- ``forward``: the scoring thread (Python threads named ``forward*``);
- ``librdkafka``: librdkafka's own threads (``rdk:*``);
- ``native``: threads Python does not know (torch's OpenMP/MKL workers and other native pools);
- ``python:<name>``: other Python threads (the model watcher, the metrics server, ...);
- ``exited``: this process's CPU not seen on a live thread at the last sample (threads that
  ended between samples).

Example::

    with CpuAccount.of_stack(settings) as account:
        pipeline.run(exit_when_idle_s=2.0)
    account.result()["cores"]          # {"loop": 0.93, "librdkafka": 0.21, "broker": 0.35, ...}
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlparse

from pipeline.settings.loading import Settings

__all__ = ["CpuAccount", "listening_pid", "process_cpu_s", "thread_cpu_s"]

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _stat_cpu_s(stat: str) -> float:
    """utime + stime of a ``/proc/.../stat`` line, in seconds (fields 14 and 15; the command
    name in parentheses may hold spaces)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def process_cpu_s(pid: int) -> float:
    """CPU seconds process ``pid`` has used, all its threads (exited ones too).

    Raises:
        ProcessLookupError: the process is gone.
    """
    try:
        return _stat_cpu_s(Path(f"/proc/{pid}/stat").read_text())
    except FileNotFoundError as exc:
        raise ProcessLookupError(pid) from exc


def thread_cpu_s(pid: int) -> dict[int, tuple[str, float]]:
    """Every live thread of ``pid``: ``tid -> (its comm, CPU seconds)``."""
    out: dict[int, tuple[str, float]] = {}
    task = Path(f"/proc/{pid}/task")
    for entry in task.iterdir():
        try:
            comm = (entry / "comm").read_text().strip()
            out[int(entry.name)] = (comm, _stat_cpu_s((entry / "stat").read_text()))
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended while we looked
    return out


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(cols[9])
    return inodes


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this host (``None``: none found, or it belongs
    to a user whose file descriptors this one cannot read)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    return int(proc.name)
        except (PermissionError, FileNotFoundError, ProcessLookupError):
            continue
    return None


def _port(address: str) -> int | None:
    try:
        return int(address.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


def stack_pids(settings: Settings) -> dict[str, int]:
    """The local broker's and Redis's pids (those found: a remote stack has none here)."""
    found: dict[str, int] = {}
    broker_port = _port(settings.kafka.bootstrap_servers.split(",")[0])
    redis_port = urlparse(settings.redis.url).port
    for name, port in (("broker", broker_port), ("redis", redis_port)):
        pid = listening_pid(port) if port else None
        if pid is not None and pid != os.getpid():
            found[name] = pid
    return found


@dataclass
class _Seen:
    """One thread's first and last CPU reading and its role."""

    role: str
    first: float
    last: float


@dataclass
class CpuAccount:
    """CPU per thread of this process and per other process, between enter and exit.

    Args:
        others: other processes to account, by name (e.g. ``{"broker": 1234}``).
        every_s: sampling period.
    """

    others: dict[str, int] = field(default_factory=dict)
    every_s: float = 0.25
    _threads: dict[int, _Seen] = field(default_factory=dict)
    _others_first: dict[str, float] = field(default_factory=dict)
    _others_last: dict[str, float] = field(default_factory=dict)
    _process: tuple[float, float] = (0.0, 0.0)
    _wall: tuple[float, float] = (0.0, 0.0)
    _loop_tid: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None

    @classmethod
    def of_stack(cls, settings: Settings, **others: int) -> CpuAccount:
        """An account of this process, the local broker and Redis, and ``others``."""
        return cls({**stack_pids(settings), **others})

    def __enter__(self) -> CpuAccount:
        self._loop_tid = threading.get_native_id()
        self._wall = (time.monotonic(), 0.0)
        self._process = (process_cpu_s(os.getpid()), 0.0)
        self._sample(first=True)
        self._sampler = threading.Thread(target=self._run, name="cpu-account", daemon=True)
        self._sampler.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
        self._sample(first=False)
        self._wall = (self._wall[0], time.monotonic())
        self._process = (self._process[0], process_cpu_s(os.getpid()))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample(first=False)

    def _roles(self) -> dict[int, str]:
        roles = {}
        for thread in threading.enumerate():
            if thread.native_id is None:
                continue
            name = thread.name
            if thread.native_id == self._loop_tid:
                roles[thread.native_id] = "loop"
            elif name.startswith("forward"):
                roles[thread.native_id] = "forward"
            elif name == "cpu-account":
                roles[thread.native_id] = "cpu account (this sampler)"
            else:
                roles[thread.native_id] = "python:" + re.sub(r"[-_]?\d+", "", name)
        return roles

    def _sample(self, first: bool) -> None:
        roles = self._roles()
        for tid, (comm, cpu) in thread_cpu_s(os.getpid()).items():
            seen = self._threads.get(tid)
            if seen is None:
                role = roles.get(tid) or ("librdkafka" if comm.startswith("rdk:") else "native")
                self._threads[tid] = _Seen(role, cpu if first else 0.0, cpu)
            else:
                seen.last = cpu
        for name, pid in self.others.items():
            try:
                cpu = process_cpu_s(pid)
            except ProcessLookupError:
                continue
            if first:
                self._others_first[name] = cpu
            self._others_last[name] = cpu

    def result(self) -> dict[str, Any]:
        """The account (after the ``with`` block).

        Returns:
            ``wall_s``; ``cpu_s`` by thread role and by other process; ``cores`` (CPU seconds
            per wall second) of the same; ``process_cpu_s``, this whole process.
        """
        wall = max(1e-9, self._wall[1] - self._wall[0])
        cpu: dict[str, float] = {}
        for seen in self._threads.values():
            cpu[seen.role] = cpu.get(seen.role, 0.0) + seen.last - seen.first
        process = self._process[1] - self._process[0]
        cpu["exited"] = max(0.0, process - sum(cpu.values()))
        for name, last in self._others_last.items():
            cpu[name] = last - self._others_first.get(name, last)
        ordered = dict(sorted(cpu.items(), key=lambda kv: -kv[1]))
        return {
            "wall_s": round(wall, 3),
            "process_cpu_s": round(process, 2),
            "cpu_s": {k: round(v, 2) for k, v in ordered.items()},
            "cores": {k: round(v / wall, 3) for k, v in ordered.items()},
            "processes": dict(self.others),
        }
