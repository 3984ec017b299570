"""What a versions directory's pieces say: the pointer file, one version, valid names.

No torch import: listing and promoting versions (``streamrank model list|promote``) stay fast.
See :mod:`model.store.versions` for the layout.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DCP_INDEX_FILE",
    "POINTER_FILE",
    "NoCurrentVersionError",
    "UnknownVersionError",
    "VersionInfo",
    "VersionPointer",
    "describe_version",
    "is_version_name",
    "validate_version_name",
]

#: The pointer file of a versions directory; its presence makes a directory one.
POINTER_FILE = "current.json"
POINTER_FORMAT_VERSION = 1
META_FILE = (
    "meta.json"  # model.store.checkpoint.META_FILE (not imported: that module imports torch)
)
#: DCP's index file inside a sharded checkpoint directory (read by model.store.dcp_reader).
DCP_INDEX_FILE = ".metadata"
#: Weights files by format: single-process ``model.pt``, DCP's index ``.metadata``.
WEIGHT_FILES = {"model.pt": "torch", DCP_INDEX_FILE: "dcp"}
_VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class NoCurrentVersionError(ValueError):
    """A versions directory whose pointer names no version yet (nothing promoted)."""


class UnknownVersionError(LookupError):
    """A version name that the versions directory does not hold."""


@dataclass(frozen=True)
class VersionPointer:
    """The content of ``current.json``.

    Attributes:
        version: the version to serve (a directory name), or ``None`` before the first
            promotion.
        generation: grows by one with every promotion (0 before the first); equal
            generations mean nothing was promoted in between.
        promoted_at: ISO-8601 UTC time of the promotion (``""`` before the first).
        previous: the version that was current before, for rollbacks.
    """

    version: str | None = None
    generation: int = 0
    promoted_at: str = ""
    previous: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the format version."""
        return {
            "format_version": POINTER_FORMAT_VERSION,
            "version": self.version,
            "generation": self.generation,
            "promoted_at": self.promoted_at,
            "previous": self.previous,
        }

    @classmethod
    def from_dict(cls, data: Any) -> VersionPointer:
        """Parse :meth:`to_dict`'s output.

        Args:
            data: the parsed JSON.

        Returns:
            The pointer.

        Raises:
            ValueError: on a malformed pointer or a newer format.
        """
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        fmt = data.get("format_version")
        if not isinstance(fmt, int) or fmt > POINTER_FORMAT_VERSION:
            raise ValueError(f"unsupported pointer format {fmt!r}")
        version, previous = data.get("version"), data.get("previous")
        generation = data.get("generation")
        if not (version is None or isinstance(version, str)) or not isinstance(generation, int):
            raise ValueError("bad version or generation")
        return cls(
            version=version,
            generation=generation,
            promoted_at=str(data.get("promoted_at", "")),
            previous=previous if isinstance(previous, str) else None,
        )

    def promoted(self, version: str) -> VersionPointer:
        """The pointer after promoting ``version`` now (generation + 1)."""
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        return VersionPointer(
            version=version,
            generation=self.generation + 1,
            promoted_at=now,
            previous=self.version if self.version != version else self.previous,
        )


@dataclass(frozen=True)
class VersionInfo:
    """One version of a versions directory, as ``ModelVersions.list_versions`` reports it.

    Attributes:
        version: the directory name (equal to its checkpoint's ``model_version``).
        path: the checkpoint directory.
        current: whether the pointer names it.
        complete: whether it holds a readable ``meta.json`` and weights (``model.pt`` or a DCP
            index); the weights themselves are checked when a server loads them.
        created_at: the checkpoint's ``created_at`` (``""`` when unreadable).
        weights_format: ``"torch"``, ``"dcp"`` or ``""`` (no weights).
        metrics: the checkpoint's training metrics (e.g. ``{"auc": 0.87}``).
    """

    version: str
    path: Path
    current: bool
    complete: bool
    created_at: str = ""
    weights_format: str = ""
    metrics: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``path`` as a string)."""
        return {
            "version": self.version,
            "path": str(self.path),
            "current": self.current,
            "complete": self.complete,
            "created_at": self.created_at,
            "weights_format": self.weights_format,
            "metrics": dict(self.metrics),
        }


def is_version_name(name: str) -> bool:
    """Whether ``name`` can name a version directory (see :func:`validate_version_name`)."""
    return bool(_VERSION_NAME.fullmatch(name)) and name != POINTER_FILE


def validate_version_name(version: str) -> str:
    """Return ``version`` if it can name a version directory.

    Names start with a letter or digit and hold letters, digits, ``.``, ``_`` and ``-`` (at
    most 128 characters), so they are safe as directory names and never hidden.

    Args:
        version: the proposed name.

    Returns:
        ``version``.

    Raises:
        ValueError: if it cannot.
    """
    if not is_version_name(version):
        raise ValueError(
            f"bad version name {version!r}: use letters, digits, '.', '_' and '-' "
            "(starting with a letter or digit, at most 128 characters)"
        )
    return version


def describe_version(path: Path, current: bool = False) -> VersionInfo:
    """What the checkpoint directory ``path`` holds, without loading weights.

    Args:
        path: a version (or any checkpoint) directory.
        current: whether the pointer names it.

    Returns:
        Its :class:`VersionInfo`; ``complete`` is False when ``meta.json`` is missing or
        unreadable or no weights file is there.
    """
    formats = [fmt for name, fmt in WEIGHT_FILES.items() if (path / name).is_file()]
    created_at, metrics, has_meta = "", {}, False
    try:
        meta = json.loads((path / META_FILE).read_text())
        created_at = str(meta.get("created_at", ""))
        metrics = {str(k): float(v) for k, v in dict(meta.get("metrics", {})).items()}
        has_meta = isinstance(meta.get("model_version"), str)
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return VersionInfo(
        version=path.name,
        path=path,
        current=current,
        complete=has_meta and bool(formats),
        created_at=created_at,
        weights_format="dcp" if "dcp" in formats else (formats[0] if formats else ""),
        metrics=metrics,
    )
