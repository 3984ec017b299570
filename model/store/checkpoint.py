"""Checkpoint directories: ``meta.json`` (version, spec, metrics, provenance) + ``model.pt``.

Layout::

    <path>/
      meta.json   {"format_version": 1, "model_version": "dlrm-20250101-1a2b3c4d",
                   "created_at": "...Z", "spec": {...}, "metrics": {"auc": 0.87},
                   "framework_versions": {"torch": ..., "torchrec": ..., ...},
                   "weights_sha256": "..."}
      model.pt    torch.save(ranker.state_dict()) with CPU tensors

Saving is atomic: everything is written into a temporary sibling directory that is renamed into
place, so readers never see a half-written checkpoint. The state dict is the unsharded
:class:`~model.ranker.Ranker` layout, which ``DistributedModelParallel`` can load directly.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import uuid
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from model.features.spec import FeatureSpec, spec_from_dict, spec_to_dict
from model.ranker import Ranker, build_ranker

__all__ = [
    "FORMAT_VERSION",
    "META_FILE",
    "WEIGHTS_FILE",
    "CheckpointMeta",
    "load_checkpoint",
    "load_meta",
    "load_spec",
    "load_state_dict",
    "save_checkpoint",
    "weights_digest",
]

FORMAT_VERSION = 1
META_FILE = "meta.json"
WEIGHTS_FILE = "model.pt"
_VERSIONED_PACKAGES = ("torch", "torchrec", "fbgemm-gpu-cpu", "fbgemm-gpu", "numpy")


@dataclass(frozen=True)
class CheckpointMeta:
    """What ``meta.json`` holds.

    Args:
        model_version: identifies the weights, e.g. ``dlrm-20250101-1a2b3c4d``.
        spec: the :class:`FeatureSpec` the weights were trained for.
        created_at: ISO-8601 UTC timestamp of the save.
        metrics: training/evaluation metrics (e.g. ``{"auc": 0.87}``).
        framework_versions: package versions at save time (plus ``python``).
        weights_sha256: SHA-256 of the weights (see :func:`weights_digest`).
        format_version: layout version of the checkpoint directory.
    """

    model_version: str
    spec: FeatureSpec
    created_at: str
    metrics: dict[str, float] = field(default_factory=dict)
    framework_versions: dict[str, str] = field(default_factory=dict)
    weights_sha256: str = ""
    format_version: int = FORMAT_VERSION

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the content of ``meta.json``)."""
        return {
            "format_version": self.format_version,
            "model_version": self.model_version,
            "created_at": self.created_at,
            "spec": spec_to_dict(self.spec),
            "metrics": dict(self.metrics),
            "framework_versions": dict(self.framework_versions),
            "weights_sha256": self.weights_sha256,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckpointMeta:
        """Parse :meth:`to_dict`'s output.

        Raises:
            ValueError: on missing fields, a newer format or a bad spec.
        """
        try:
            version = int(data["format_version"])
            if version > FORMAT_VERSION:
                raise ValueError(
                    f"checkpoint format {version} is newer than supported ({FORMAT_VERSION})"
                )
            return cls(
                model_version=str(data["model_version"]),
                spec=spec_from_dict(data["spec"]),
                created_at=str(data["created_at"]),
                metrics={str(k): float(v) for k, v in dict(data.get("metrics", {})).items()},
                framework_versions={
                    str(k): str(v) for k, v in dict(data.get("framework_versions", {})).items()
                },
                weights_sha256=str(data.get("weights_sha256", "")),
                format_version=version,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"bad checkpoint metadata: {exc!r}") from exc


def weights_digest(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 over parameter names, dtypes, shapes and bytes, in sorted name order.

    Args:
        state_dict: CPU tensors (e.g. ``ranker.state_dict()``).

    Returns:
        64 hex digits; equal weights give equal digests.
    """
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        # The buffer itself, not a bytes copy: a 10M-row table would need 2.5 GB more.
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def save_checkpoint(
    ranker: Ranker,
    spec: FeatureSpec,
    path: str | os.PathLike[str],
    model_version: str | None = None,
    metrics: dict[str, float] | None = None,
    overwrite: bool = False,
) -> CheckpointMeta:
    """Write ``ranker``'s weights and metadata to the directory ``path``, atomically.

    Args:
        ranker: the model (its tables must be materialised, not on ``meta``).
        spec: the spec it was built from (must equal ``ranker.spec``).
        path: the checkpoint directory to create.
        model_version: defaults to ``dlrm-<UTC date YYYYMMDD>-<first 8 hex of the weights'
            SHA-256>``.
        metrics: e.g. ``{"auc": 0.87}``; values are stored as floats.
        overwrite: replace an existing checkpoint at ``path`` (else it is an error).

    Returns:
        The written :class:`CheckpointMeta`.

    Raises:
        FileExistsError: if ``path`` exists and ``overwrite`` is False.
        ValueError: if ``spec`` differs from the ranker's or the weights are on ``meta``.

    Example::

        meta = save_checkpoint(result.ranker, spec, "artifacts/ckpt", metrics={"auc": 0.87})
        print(meta.model_version)
    """
    target = Path(path)
    if spec != ranker.spec:
        raise ValueError("spec differs from the spec the ranker was built with")
    if target.exists() and not overwrite:
        raise FileExistsError(f"checkpoint path already exists: {target}")
    raw_state = ranker.state_dict()
    if any(t.is_meta for t in raw_state.values()):
        raise ValueError("cannot save a ranker whose weights are on the meta device")
    state = {name: t.detach().to("cpu") for name, t in raw_state.items()}
    sha = weights_digest(state)
    meta = new_meta(spec, model_version, metrics, weights_sha256=sha, version_suffix=sha[:8])

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        torch.save(state, tmp / WEIGHTS_FILE)
        (tmp / META_FILE).write_text(json.dumps(meta.to_dict(), indent=2, sort_keys=True) + "\n")
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return meta


def load_meta(path: str | os.PathLike[str]) -> CheckpointMeta:
    """Read and parse ``<path>/meta.json``.

    Args:
        path: the checkpoint directory.

    Returns:
        The :class:`CheckpointMeta`.

    Raises:
        FileNotFoundError: if the directory or ``meta.json`` is missing.
        ValueError: if ``meta.json`` is not valid checkpoint metadata.

    Example::

        print(load_meta("artifacts/ckpt").model_version)
    """
    meta_path = Path(path) / META_FILE
    if not Path(path).is_dir():
        raise FileNotFoundError(f"checkpoint directory not found: {path}")
    if not meta_path.is_file():
        raise FileNotFoundError(f"checkpoint metadata not found: {meta_path}")
    try:
        data = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"corrupt checkpoint metadata {meta_path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"corrupt checkpoint metadata {meta_path}: not a JSON object")
    try:
        return CheckpointMeta.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{meta_path}: {exc}") from exc


def load_spec(path: str | os.PathLike[str]) -> FeatureSpec:
    """The :class:`FeatureSpec` of a checkpoint, without loading weights.

    Use it to build the model elsewhere, e.g. ``build_ranker(spec, embedding_device="meta")``
    before sharding, then load :func:`load_state_dict` into the sharded model.

    Args:
        path: the checkpoint directory.

    Returns:
        The spec.

    Raises:
        FileNotFoundError, ValueError: as :func:`load_meta`.
    """
    return load_meta(path).spec


def load_state_dict(
    path: str | os.PathLike[str],
    map_location: torch.device | str = "cpu",
    verify: bool = True,
    mmap: bool = False,
) -> dict[str, torch.Tensor]:
    """The checkpoint's weights (the unsharded ``Ranker.state_dict()``).

    Args:
        path: the checkpoint directory.
        map_location: where to load the tensors.
        verify: check the weights against ``meta.json``'s ``weights_sha256``.
        mmap: map the file instead of reading it (``torch.load(mmap=True)``): CPU tensors are
            views of the page cache, shared by every process that maps the file, so a rank
            that copies only its shards never holds a private copy of the whole model.

    Returns:
        Parameter name -> tensor.

    Raises:
        FileNotFoundError: if ``model.pt`` (or the metadata, when verifying) is missing.
        ValueError: if the file is unreadable or fails verification.
    """
    weights_path = Path(path) / WEIGHTS_FILE
    meta = load_meta(path) if verify else None
    if not weights_path.is_file():
        raise FileNotFoundError(f"checkpoint weights not found: {weights_path}")
    try:
        state = torch.load(weights_path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises several types for truncated/garbled files
        raise ValueError(f"corrupt checkpoint weights {weights_path}: {exc}") from exc
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ValueError(f"corrupt checkpoint weights {weights_path}: not a state dict")
    if meta is not None and meta.weights_sha256 and weights_digest(state) != meta.weights_sha256:
        raise ValueError(f"checkpoint weights {weights_path} do not match meta.json's digest")
    return {k: v.to(map_location) for k, v in state.items()}


def load_checkpoint(
    path: str | os.PathLike[str], device: torch.device | str = "cpu"
) -> tuple[Ranker, CheckpointMeta]:
    """Rebuild the ranker from a checkpoint directory.

    Args:
        path: the checkpoint directory.
        device: where to put the model.

    Returns:
        ``(ranker in eval mode, metadata)``.

    Raises:
        FileNotFoundError: if the directory, ``meta.json`` or ``model.pt`` is missing.
        ValueError: if either file is corrupt or the weights do not fit the spec.

    Example::

        ranker, meta = load_checkpoint("artifacts/ckpt")
        probs = ranker.score(build_model_input(cols, meta.spec))
    """
    meta = load_meta(path)
    state = load_state_dict(path, map_location="cpu")
    ranker = build_ranker(meta.spec, device="cpu")
    try:
        ranker.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"checkpoint {path} does not fit its spec: {exc}") from exc
    ranker = ranker.to(torch.device(device))
    ranker.eval()
    return ranker, meta


def replace_dir(tmp: Path, target: Path) -> None:
    """Move a fully written checkpoint directory into place (an existing one is replaced)."""
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:12]}"
        target.rename(old)
        tmp.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(target)


def new_meta(
    spec: FeatureSpec,
    model_version: str | None,
    metrics: dict[str, float] | None,
    weights_sha256: str,
    version_suffix: str,
) -> CheckpointMeta:
    """Metadata of a checkpoint written now; the default version is
    ``dlrm-<YYYYMMDD>-<version_suffix>``."""
    now = dt.datetime.now(dt.UTC)
    return CheckpointMeta(
        model_version=model_version or f"dlrm-{now:%Y%m%d}-{version_suffix}",
        spec=spec,
        created_at=now.isoformat(timespec="seconds").replace("+00:00", "Z"),
        metrics={str(k): float(v) for k, v in (metrics or {}).items()},
        framework_versions=framework_versions(),
        weights_sha256=weights_sha256,
    )


def framework_versions() -> dict[str, str]:
    """Python and ML-stack package versions, recorded in ``meta.json``."""
    versions = {"python": platform.python_version()}
    for package in _VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions
