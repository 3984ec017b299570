"""Compiled kernels: numba's ``njit`` with an on-disk cache that several processes can share.

Every compiled kernel of streamrank is cached on disk (``cache=True``: a process loads the
machine code instead of compiling it again). numba's cache is not safe when processes compile
new signatures of one function at the same time (numba issue 4807, still open in 0.68): each
reads the function's index, picks the same free data file for its own signature and writes it,
and the index that stays can name the data file the other process wrote. The machine code of
one signature can then be loaded for another's, or a signature's entry lost. Loaded machine code
of the wrong signature corrupts memory: the likely cause of the test-suite failures where a
pytest worker's dictionaries were overwritten (a fresh clone whose empty cache three workers
filled at once; not reproduced on demand). Any fresh install that starts several processes at
once meets the race: the ranks of a job, ingest workers, replicas sharing a volume.

:func:`kernel` compiles with numba's cache and, once per process, makes each function's cache
use an advisory lock (``fcntl.flock`` on a ``.lock`` file beside its index): a save holds it
exclusively from reading the index to writing the data, a load holds it shared, so an index
never names another signature's data.

Example::

    @kernel
    def _double(values: npt.NDArray[np.int64]) -> None:
        for i in range(len(values)):
            values[i] *= 2
"""

from __future__ import annotations

import fcntl
import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import numba
from numba.core import caching

__all__ = ["kernel"]

F = TypeVar("F", bound=Callable[..., Any])

_CACHE_FILE = caching.IndexDataCacheFile
_LOCKED = "_streamrank_locked"


def _with_lock(method: Callable[..., Any], mode: int) -> Callable[..., Any]:
    """``method`` of the cache file, run holding its function's lock in ``mode``."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any) -> Any:
        try:
            fd = os.open(f"{self._index_path}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:  # a cache directory we cannot write: nothing is saved there either
            return method(self, *args)
        try:
            fcntl.flock(fd, mode)
            return method(self, *args)
        finally:
            os.close(fd)  # releases the lock

    return locked


def _lock_the_cache() -> None:
    """Make numba's cache files take their lock (once per process)."""
    if getattr(_CACHE_FILE, _LOCKED, False):
        return
    for name in ("save", "load", "flush"):
        if not callable(getattr(_CACHE_FILE, name, None)):
            raise RuntimeError(
                f"numba {numba.__version__}: IndexDataCacheFile.{name} is gone; "
                "model/kernels.py locks numba's cache through it"
            )
    _CACHE_FILE.save = _with_lock(_CACHE_FILE.save, fcntl.LOCK_EX)  # type: ignore[method-assign]
    _CACHE_FILE.flush = _with_lock(_CACHE_FILE.flush, fcntl.LOCK_EX)  # type: ignore[method-assign]
    _CACHE_FILE.load = _with_lock(_CACHE_FILE.load, fcntl.LOCK_SH)  # type: ignore[method-assign]
    setattr(_CACHE_FILE, _LOCKED, True)


def kernel(function: F | None = None, /, **options: Any) -> Any:
    """Compile ``function`` with numba (``nopython``, the GIL released, cached on disk under a
    lock shared by every process; see the module docstring).

    Args:
        function: the kernel (``@kernel``), or ``None`` with ``options`` (``@kernel(...)``).
        options: more of ``numba.njit``'s options, e.g. ``inline="always"``.

    Returns:
        The compiled dispatcher, or a decorator making one.
    """
    _lock_the_cache()
    compile_ = numba.njit(cache=True, nogil=True, **options)
    return compile_ if function is None else compile_(function)
