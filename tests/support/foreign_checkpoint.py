"""Sharded-checkpoint indexes (``.metadata``) that run code when plain :mod:`pickle` reads them.

DCP's own reader unpickles ``.metadata`` with :func:`pickle.load`; these files are what an
attacker who can write a model version would put there. Their payload creates a marker file,
so a test proves it never ran by the marker's absence (and :func:`payload_runs` proves the
payload is real: plain pickle does create the marker).

Example::

    write_foreign_index(version_dir, marker)        # the index is the payload itself
    hide_in_real_index(version_dir, marker)         # a real index with the payload inside
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

INDEX_FILE = ".metadata"


class CreatesFile:
    """Unpickling this object opens (creates) ``marker`` for writing."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.marker, "w"))


def payload(marker: Path) -> bytes:
    """A pickle whose loading creates ``marker``."""
    return pickle.dumps(CreatesFile(marker))


def payload_runs(tmp: Path) -> bool:
    """Whether plain :func:`pickle.loads` runs :func:`payload` (it creates the marker)."""
    marker = tmp / "plain-pickle-ran"
    pickle.loads(payload(marker)).close()
    return marker.exists()


def write_foreign_index(checkpoint: Path, marker: Path) -> None:
    """Replace (or add) ``checkpoint``'s index by the payload alone."""
    (checkpoint / INDEX_FILE).write_bytes(payload(marker))


def hide_in_real_index(checkpoint: Path, marker: Path) -> None:
    """Keep ``checkpoint``'s real DCP index, with the payload in its ``planner_data``."""
    index = checkpoint / INDEX_FILE
    metadata = pickle.loads(index.read_bytes())  # written by DCP in the test, trusted here
    metadata.planner_data = {"hidden": CreatesFile(marker)}
    index.write_bytes(pickle.dumps(metadata))


def foreign_copy(checkpoint: Path, dest: Path, marker: Path, version: str) -> Path:
    """A copy of ``checkpoint`` named ``version`` (its ``meta.json`` says so) whose index is
    the payload: what a training job with a grudge would leave in a versions directory."""
    shutil.copytree(checkpoint, dest)
    meta = dest / "meta.json"
    data = json.loads(meta.read_text())
    data["model_version"] = version
    meta.write_text(json.dumps(data))
    write_foreign_index(dest, marker)
    return dest
