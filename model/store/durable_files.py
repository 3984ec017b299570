"""Small durable-file helpers: atomic JSON replace, fsync of trees, an exclusive lock file.

Used by :mod:`model.store.versions` so that a promoted model version is on disk before the pointer
names it, and the pointer itself is replaced in one rename.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["exclusive_lock", "fsync_dir", "fsync_tree", "write_json_atomically"]


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` by ``data`` as JSON in one rename; readers see the old or new file.

    The JSON goes to a temporary sibling, is fsynced, renamed over ``path`` (``os.replace``,
    atomic on POSIX file systems), and the directory is fsynced.

    Args:
        path: the file to (re)place.
        data: a JSON-serialisable object.

    Example::

        write_json_atomically(root / "current.json", {"version": "v2"})
    """
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root``.

    Args:
        root: a directory about to be renamed into place.
    """
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path`` (makes renames and new entries in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block.

    Serialises writers on one host or one shared volume. Not re-entrant: a block must not
    take the same lock again.

    Args:
        path: the lock file.

    Example::

        with exclusive_lock(root / ".lock"):
            ...
    """
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
