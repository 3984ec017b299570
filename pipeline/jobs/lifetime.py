"""Process lifetime: every process of a job dies with the process that started it.

``streamrank run --nproc N`` is a chain of three processes: the launcher
(:mod:`pipeline.jobs.launch`) starts torchrun's elastic agent, and the agent starts the N ranks. An
orchestrator that SIGKILLs the launcher must not leave the agent or the ranks running (they would
keep their partitions' leases and hang in a collective), so each link holds on Linux's
``prctl(PR_SET_PDEATHSIG)``: the kernel sends a signal to a process when its parent exits.

- launcher -> agent: the launcher starts torchrun with :func:`preexec_die_with_parent` (the
  death signal is set in the child between ``fork`` and ``exec``; it survives ``exec``).
- agent -> rank: each rank calls :func:`bind_rank_to_launcher` first thing.

A parent that died *before* the child set its death signal is caught too: the child checks
that its parent is still the process that started it (the launcher passes its pid in
:data:`LAUNCHER_PID_ENV`), and otherwise signals itself at once.

The death signal is sent when the *thread* that forked the child exits; the launcher and
torchrun's agent both start their children from their main thread.

Example::

    subprocess.Popen(cmd, preexec_fn=preexec_die_with_parent(signal.SIGKILL))
    bind_rank_to_launcher()  # first line of a rank
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

__all__ = [
    "LAUNCHER_PID_ENV",
    "bind_rank_to_launcher",
    "children",
    "die_with_parent",
    "parent_of",
    "preexec_die_with_parent",
    "set_parent_death_signal",
]

#: Set by the launcher for torchrun (and so for the ranks): the launcher's pid.
LAUNCHER_PID_ENV = "STREAMRANK_LAUNCHER_PID"
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    function: Callable[..., int] = prctl
    return function


_PRCTL = _load_prctl()  # resolved once: a preexec_fn must not load libraries after fork


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits.

    Args:
        sig: the signal (``signal.SIGKILL``: die at once; ``0`` clears it).

    Returns:
        Whether it was set (``False`` off Linux, where there is no such call).

    Raises:
        OSError: prctl failed.

    Example::

        set_parent_death_signal(signal.SIGKILL)
    """
    if _PRCTL is None:
        return False
    if _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    return True


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> None:
    """Die with ``parent_pid``: set the death signal, then check the parent is still ours.

    If the parent exited before the death signal was set, this process was already handed to
    another parent (init or a subreaper) and no signal will come: it sends ``sig`` to itself.

    Args:
        parent_pid: the process that started this one.
        sig: the signal to die by.

    Example::

        die_with_parent(int(os.environ[LAUNCHER_PID_ENV]))
    """
    if set_parent_death_signal(sig) and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def preexec_die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child dies with the calling process.

    Args:
        sig: the signal the child gets when this process exits.

    Returns:
        The function ``Popen`` runs in the child between ``fork`` and ``exec``.

    Example::

        subprocess.Popen(["sleep", "60"], preexec_fn=preexec_die_with_parent())
    """
    parent = os.getpid()

    def preexec() -> None:
        die_with_parent(parent, sig)

    return preexec


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (``/proc``), or ``None`` when it is gone or unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    return int(stat.rsplit(")", 1)[1].split()[1])


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (Linux ``/proc``; empty elsewhere).

    Example::

        children(os.getpid())  # [12345, 12346]
    """
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        child = int(entry.name)
        if child != pid and parent_of(child) == pid:
            out.append(child)
    return sorted(out)


def bind_rank_to_launcher(sig: int = signal.SIGKILL) -> None:
    """Make this rank die with torchrun's agent, and so with ``streamrank run``'s launcher.

    Sets the death signal (the agent is the parent). When the launcher started the job
    (:data:`LAUNCHER_PID_ENV`), also checks the chain is still whole: the parent's parent
    must be the launcher; otherwise a link died before this rank was bound, and the rank
    signals itself. A rank of a torchrun started by hand is bound to torchrun only.

    Args:
        sig: the signal to die by.

    Example::

        bind_rank_to_launcher()  # first line of run_rank
    """
    agent = os.getppid()
    if not set_parent_death_signal(sig):
        return
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    broken = agent == 1 or os.getppid() != agent
    if launcher and not broken:
        broken = parent_of(agent) != int(launcher)
    if broken:
        log.error("the launcher or torchrun's agent is gone: this rank stops now")
        os.kill(os.getpid(), sig)
