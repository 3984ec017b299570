"""Model versions on disk: a directory of checkpoints plus a pointer to the one to serve.

Layout::

    <root>/
      current.json      {"format_version": 1, "version": "dlrm-20250102-9f8e7d6c",
                         "generation": 4, "promoted_at": "2025-01-02T10:00:00Z",
                         "previous": "dlrm-20250101-1a2b3c4d"}
      dlrm-20250101-1a2b3c4d/   an ordinary checkpoint directory (model/store/checkpoint.py:
      meta.json +
      dlrm-20250102-9f8e7d6c/   model.pt) or a sharded one (model/distributed: meta.json + DCP)
      .lock                     serialises writers (promote, write, import); readers never lock

A version directory is named after its checkpoint's ``model_version`` (the string every
Recommendation carries) and never changes once it is in place: it is written into a hidden
sibling and renamed, so a reader sees either nothing or the whole checkpoint. The served
version may not be overwritten.

Why a JSON pointer and not a symlink renamed over ``current``: both switch atomically (the new
pointer is written to a temporary file, fsynced and ``os.replace``-d over the old one), but

- a loader that follows a ``current`` symlink resolves it at every ``open``: reading
  ``current/meta.json`` and then ``current/model.pt`` across a switch mixes two versions. The
  JSON pointer is read once and names a concrete, immutable directory;
- the file carries a ``generation`` counter that grows with every promotion: an integer that
  ranks of a sharded job can agree on with one ``all_reduce`` before switching at the same
  step, and that tells a re-promotion (retry the same version) from no change;
- it works where symlinks do not (some Docker volume drivers, SMB/object-store mounts,
  Windows bind mounts) and keeps ``previous`` for a one-command rollback.

Checking for a change is one read of a ~150-byte file (:meth:`ModelVersions.pointer`), cheap
enough to poll every second or two.

A plain checkpoint directory (no ``current.json``) keeps working everywhere a checkpoint is
expected: :func:`resolve_checkpoint` returns it unchanged, and the current version's
directory for a versions directory.

Example::

    versions = ModelVersions.create("artifacts/models")
    meta = versions.write(result.ranker, spec, promote=True)
    versions.promote("dlrm-20250101-1a2b3c4d")          # roll back
    serving_dir = resolve_checkpoint("artifacts/models")  # .../dlrm-20250101-1a2b3c4d
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from model.store.durable_files import exclusive_lock, fsync_dir, fsync_tree, write_json_atomically
from model.store.version_info import (
    DCP_INDEX_FILE,
    META_FILE,
    POINTER_FILE,
    NoCurrentVersionError,
    UnknownVersionError,
    VersionInfo,
    VersionPointer,
    describe_version,
    is_version_name,
    validate_version_name,
)

if TYPE_CHECKING:
    from model.features.spec import FeatureSpec
    from model.ranker import Ranker
    from model.store.checkpoint import CheckpointMeta

__all__ = [
    "POINTER_FILE",
    "ModelVersions",
    "NoCurrentVersionError",
    "UnknownVersionError",
    "VersionInfo",
    "VersionPointer",
    "is_versions_dir",
    "resolve_checkpoint",
    "validate_version_name",
]

_LOCK_FILE = ".lock"


def is_versions_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a versions directory (it holds ``current.json``)."""
    return (Path(path) / POINTER_FILE).is_file()


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory to serve for ``model.checkpoint = path``.

    Args:
        path: a plain checkpoint directory, or a versions directory.

    Returns:
        ``path`` itself for a plain checkpoint; the current version's directory for a
        versions directory.

    Raises:
        NoCurrentVersionError: for a versions directory with nothing promoted yet.
        FileNotFoundError: if ``path`` is neither, or the current version's directory is gone.
        ValueError: if ``current.json`` is corrupt.

    Example::

        scorer = Scorer.from_checkpoint(resolve_checkpoint(settings.model.checkpoint))
    """
    root = Path(path)
    if (root / META_FILE).is_file():
        return root
    if is_versions_dir(root):
        return ModelVersions(root).current_path()
    raise FileNotFoundError(f"no model at {root}: neither a checkpoint nor a versions directory")


class ModelVersions:
    """A versions directory: list, write and promote versions, read the pointer.

    Args:
        root: the directory (see the module docstring); use :meth:`create` for a new one.

    Raises:
        FileNotFoundError: if ``root`` is not a versions directory.

    Example::

        versions = ModelVersions("artifacts/models")
        for info in versions.list_versions():
            print(info.version, "*" if info.current else "")
        versions.promote(versions.list_versions()[-1].version)
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        if not is_versions_dir(self.root):
            raise FileNotFoundError(f"not a versions directory (no {POINTER_FILE}): {self.root}")

    @classmethod
    def create(cls, root: str | os.PathLike[str]) -> ModelVersions:
        """Make ``root`` a versions directory (nothing promoted yet); an existing one is kept.

        Raises:
            FileExistsError: if ``root`` holds a plain checkpoint or is not an empty directory.
        """
        target = Path(root)
        if is_versions_dir(target):
            return cls(target)
        if (target / META_FILE).exists():
            raise FileExistsError(f"{target} holds a plain checkpoint, not versions")
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise FileExistsError(f"{target} exists and is not an empty directory")
        target.mkdir(parents=True, exist_ok=True)
        write_json_atomically(target / POINTER_FILE, VersionPointer().to_dict())
        return cls(target)

    def pointer(self) -> VersionPointer:
        """The current ``current.json`` (one small read: fine to poll every second).

        Raises:
            ValueError: if the file is corrupt.
        """
        path = self.root / POINTER_FILE
        try:
            return VersionPointer.from_dict(json.loads(path.read_text()))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
            raise ValueError(f"corrupt version pointer {path}: {exc}") from exc

    def current(self) -> str | None:
        """The current version's name, ``None`` before the first promotion."""
        return self.pointer().version

    def path(self, version: str) -> Path:
        """The directory of ``version`` (which may not exist yet)."""
        return self.root / validate_version_name(version)

    def current_path(self) -> Path:
        """The current version's checkpoint directory.

        Raises:
            NoCurrentVersionError: before the first promotion.
            FileNotFoundError: if the directory is gone.
        """
        version = self.current()
        if version is None:
            raise NoCurrentVersionError(
                f"no current model version in {self.root}: promote one "
                "(`streamrank model promote VERSION`)"
            )
        path = self.path(version)
        if not (path / META_FILE).is_file():
            raise FileNotFoundError(f"current model version {version} is missing: {path}")
        return path

    def list_versions(self) -> list[VersionInfo]:
        """Every version, oldest first (by ``created_at``, then name); hidden entries skipped."""
        current = self.current()
        found = [
            describe_version(entry, entry.name == current)
            for entry in self.root.iterdir()
            if entry.is_dir() and is_version_name(entry.name)
        ]
        return sorted(found, key=lambda info: (info.created_at, info.version))

    def promote(self, version: str) -> VersionPointer:
        """Make ``version`` current (atomically); promoting the current one again bumps the
        generation, which makes a watcher retry a version that failed to load.

        Args:
            version: an existing, complete version.

        Returns:
            The new pointer.

        Raises:
            UnknownVersionError: if there is no such version (the message lists the known ones).
            ValueError: if the version is incomplete or its name is invalid.
        """
        path = self.path(version)
        with exclusive_lock(self.root / _LOCK_FILE):
            if not path.is_dir():
                known = ", ".join(info.version for info in self.list_versions()) or "none"
                raise UnknownVersionError(
                    f"no model version {version!r} in {self.root} (known: {known})"
                )
            if not describe_version(path, False).complete:
                raise ValueError(f"model version {version} is incomplete (no meta.json/weights)")
            new = self.pointer().promoted(version)
            write_json_atomically(self.root / POINTER_FILE, new.to_dict())
        return new

    def write(
        self,
        ranker: Ranker,
        spec: FeatureSpec,
        version: str | None = None,
        metrics: dict[str, float] | None = None,
        overwrite: bool = False,
        promote: bool = False,
    ) -> CheckpointMeta:
        """Save ``ranker`` as a new version (see :func:`model.store.checkpoint.save_checkpoint`).

        Args:
            ranker: the model (materialised weights).
            spec: its spec.
            version: the name (and ``model_version``); default ``dlrm-<date>-<weights hash>``.
            metrics: e.g. ``{"auc": 0.87}``.
            overwrite: replace an existing version of that name (never the current one).
            promote: make it current once it is in place.

        Returns:
            The checkpoint's metadata; ``meta.model_version`` is the version's name.

        Raises:
            FileExistsError: if the version exists (and ``overwrite`` is off, or it is current).
        """
        from model.store.checkpoint import save_checkpoint  # torch: only for writers

        if version is not None:
            validate_version_name(version)
        staging = self._staging()
        try:
            meta = save_checkpoint(ranker, spec, staging, model_version=version, metrics=metrics)
            self._place(staging, validate_version_name(meta.model_version), overwrite, promote)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return meta

    def add(
        self,
        source: str | os.PathLike[str],
        version: str | None = None,
        overwrite: bool = False,
        promote: bool = False,
    ) -> str:
        """Copy an existing checkpoint directory (plain or DCP) in as a new version.

        Args:
            source: the checkpoint directory (left untouched).
            version: the name; default its ``model_version``. A different name is written
                into the copy's ``meta.json`` too, so Recommendations carry the version's name.
            overwrite: replace an existing version of that name (never the current one).
            promote: make it current once it is in place.

        Returns:
            The version's name.

        Raises:
            FileNotFoundError: if ``source`` is not a complete checkpoint.
            FileExistsError: as :meth:`write`.
            model.store.dcp_reader.UnsafeCheckpoint: a sharded checkpoint whose index
                (``.metadata``) names anything besides DCP's own classes (a ``ValueError``;
                nothing of it is run).
        """
        src = Path(source)
        if not describe_version(src, False).complete:
            raise FileNotFoundError(f"no complete checkpoint (meta.json and weights) in {src}")
        staging = self._staging()
        try:
            shutil.copytree(src, staging)
            _check_sharded_index(staging)
            meta_path = staging / META_FILE
            meta = json.loads(meta_path.read_text())
            name = validate_version_name(version or str(meta.get("model_version", "")))
            if meta.get("model_version") != name:
                meta["model_version"] = name
                meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
            self._place(staging, name, overwrite, promote)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return name

    def _staging(self) -> Path:
        """A fresh hidden path inside ``root`` (same file system: the final rename is atomic)."""
        return self.root / f".incoming-{uuid.uuid4().hex[:12]}"

    def _place(self, staging: Path, version: str, overwrite: bool, promote: bool) -> None:
        """Rename a complete staged checkpoint to ``root/version`` (under the writers' lock)."""
        target = self.path(version)
        with exclusive_lock(self.root / _LOCK_FILE):
            if target.exists():
                if not overwrite or self.current() == version:
                    why = "it is the current version" if overwrite else "pass overwrite"
                    raise FileExistsError(f"model version {version} already exists ({why})")
                old = self.root / f".replaced-{uuid.uuid4().hex[:12]}"
                target.rename(old)
                shutil.rmtree(old, ignore_errors=True)
            fsync_tree(staging)
            staging.rename(target)
            fsync_dir(self.root)
        if promote:
            self.promote(version)


def _check_sharded_index(path: Path) -> None:
    """Refuse a sharded checkpoint whose index is not DCP's own (read without running it)."""
    if (path / DCP_INDEX_FILE).is_file():
        from model.store.dcp_reader import read_dcp_index  # torch: only for sharded imports

        read_dcp_index(path)
