"""Which processes a test session started, found by a marker in their environment.

The session puts ``STREAMRANK_TEST_SESSION=<uuid>`` into its own environment before it starts
anything (:func:`mark_session`), so every process it starts, and every process those start
(brokers, Redis, launchers, torchrun, ranks; orphaned or not), carries the marker in
``/proc/PID/environ``. Other sessions running on the same machine have other uuids: only this
session's processes match. At the end of the session :func:`leftovers` lists what is still
alive (the session then fails, see tests/conftest.py). Fixtures that start a process tree tag
it with a marker of its own (:data:`TREE_ENV`) and kill it whole with :func:`kill_marked`.

Linux only (``/proc``); elsewhere nothing is found.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from pipeline.jobs.lifetime import children

SESSION_ENV = "STREAMRANK_TEST_SESSION"
"""The test session's marker: every process the session starts inherits it."""
TREE_ENV = "STREAMRANK_TEST_TREE"
"""A marker for one process tree a fixture starts (the launcher, torchrun and the ranks)."""


def new_marker() -> str:
    """A fresh marker value."""
    return uuid.uuid4().hex


def mark_session() -> str:
    """Put a fresh :data:`SESSION_ENV` into this process's environment (children inherit it).

    Returns:
        The marker value.
    """
    marker = new_marker()
    os.environ[SESSION_ENV] = marker
    return marker


def _alive(pid: int) -> bool:
    """A process that has not exited (zombies, exited but not reaped, do not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def marked(name: str, value: str) -> list[int]:
    """Live processes, other than this one, whose environment holds ``name=value``.

    Args:
        name: the variable (:data:`SESSION_ENV`, :data:`TREE_ENV`).
        value: its value.

    Returns:
        Their pids.

    Example::

        marked(SESSION_ENV, os.environ[SESSION_ENV])  # [] at the end of a clean session
    """
    needle = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ and _alive(pid):
            found.append(pid)
    return sorted(found)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with (empty when it is gone or unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def gone(pid: int, timeout_s: float = 30.0) -> bool:
    """Whether ``pid`` has exited (a zombie counts) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def describe(pid: int) -> str:
    """``pid ppid command line`` for a report."""
    try:
        command = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")).decode()
        ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return f"{pid} (exited)"
    return f"{pid} (ppid {ppid}) {command.strip()[:300]}"


def kill_marked(name: str, value: str, timeout_s: float = 30.0) -> list[int]:
    """SIGKILL every process marked ``name=value`` (again, until none is left or
    ``timeout_s`` passed).

    Returns:
        The pids that were killed.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while (pids := marked(name, value)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    return sorted(killed)


def leftovers(value: str, grace_s: float = 15.0) -> list[int]:
    """This session's processes still alive after ``grace_s`` (time for ones being stopped
    to exit).

    Args:
        value: the session's marker.
        grace_s: how long to wait for them to go.

    Returns:
        The pids still alive.
    """
    deadline = time.monotonic() + grace_s
    while (pids := _not_own(marked(SESSION_ENV, value))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return pids


def _not_own(pids: list[int]) -> list[int]:
    """``pids`` without this interpreter's own multiprocessing resource tracker: a test that
    uses shared memory in this process starts it, and it ends with this process (its pipe
    closes at exit), after the session's last hook; a tracker of any other process counts."""
    from multiprocessing import resource_tracker

    own = getattr(resource_tracker._resource_tracker, "_pid", None)
    return [pid for pid in pids if pid != own]
