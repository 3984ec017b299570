"""A configured module's version directory: its weights and what they were imported for.

Layout (a version holds weights and JSON only; code comes from installed packages or
``model.module.code_dir``, never from here)::

    <version>/
      meta.json   {"format_version": 1, "model_version": "simpledeepfmnn-20261202-1a2b3c4d",
                   "created_at": "...Z", "weights_sha256": "...", "metrics": {},
                   "framework_versions": {...}, "architecture": {"factory": ..., "kwargs": ...,
                   "tables": [...]}}
      model.pt    the module's state_dict (prefix stripped), CPU tensors

``streamrank model import FILE`` writes one from a plain ``state_dict`` file
(:func:`import_state_dict`): the file is checked against the module built on the ``meta``
device (keys and shapes, one line), its digest recorded. A version whose ``architecture``
differs from the configured module's cannot be swapped in live (a restart builds the new
module): :func:`check_architecture`.

Example::

    meta = import_state_dict(config, Path("deepfm.pt"), versions, promote=True)
    meta = load_module_meta(versions.current_path())
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from model.module.factory import build_module
from model.module.types import ModelConfigError, ModuleConfig
from model.module.weights import check_state_dict, read_state_dict
from model.store.checkpoint import (
    META_FILE,
    WEIGHTS_FILE,
    framework_versions,
    load_state_dict,
    weights_digest,
)

if TYPE_CHECKING:
    from model.store.versions import ModelVersions

__all__ = [
    "CheckedVersion",
    "ModuleMeta",
    "check_architecture",
    "check_version",
    "import_state_dict",
    "is_module_version",
    "load_module_meta",
    "load_module_weights",
    "verify_module_weights",
]

_FORMAT_VERSION = 1


@dataclass(frozen=True)
class ModuleMeta:
    """What a module version's ``meta.json`` holds.

    Attributes:
        model_version: its name (what Recommendations carry).
        architecture: :meth:`ModuleConfig.architecture` of the module it was imported for.
        weights_sha256: digest of ``model.pt``'s tensors.
        created_at: ISO-8601 UTC time of the import.
        metrics: e.g. ``{"auc": 0.79}`` (given at import).
    """

    model_version: str
    architecture: dict[str, Any]
    weights_sha256: str
    created_at: str
    metrics: dict[str, float] = field(default_factory=dict)


def is_module_version(path: Path) -> bool:
    """Whether ``path`` holds a configured module's version (its meta has an architecture)."""
    try:
        return "architecture" in json.loads((path / META_FILE).read_text())
    except (OSError, ValueError):
        return False


def load_module_meta(path: Path) -> ModuleMeta:
    """The metadata of the module version at ``path``.

    Raises:
        FileNotFoundError: no ``meta.json``.
        ModelConfigError: it is not a module version (e.g. a built-in checkpoint).
    """
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"checkpoint metadata not found: {meta_path}")
    try:
        data = json.loads(meta_path.read_text())
        return ModuleMeta(
            model_version=str(data["model_version"]),
            architecture=dict(data["architecture"]),
            weights_sha256=str(data.get("weights_sha256", "")),
            created_at=str(data.get("created_at", "")),
            metrics={str(k): float(v) for k, v in dict(data.get("metrics", {})).items()},
        )
    except KeyError as exc:
        raise ModelConfigError(
            f"{path} is not a version of a configured module (no {exc} in meta.json): import "
            "its weights with `streamrank model import STATE_DICT_FILE`"
        ) from exc
    except (ValueError, TypeError) as exc:
        raise ModelConfigError(f"corrupt checkpoint metadata {meta_path}: {exc}") from exc


@dataclass(frozen=True)
class CheckedVersion:
    """A module version whose architecture was checked against the served module (once per
    process: whoever checked it hands it on).

    Attributes:
        path: its checkpoint directory.
        meta: its metadata, as read for the check.
    """

    path: Path
    meta: ModuleMeta


def check_version(config: ModuleConfig, path: Path) -> CheckedVersion:
    """Read the metadata of the version at ``path`` and check it was imported for ``config``.

    Raises:
        FileNotFoundError: no ``meta.json``.
        ModelConfigError: not a module version, or imported for another module.

    Example::

        checked = check_version(config, Path("artifacts/module/v1"))
    """
    meta = load_module_meta(path)
    check_architecture(config, meta, path)
    return CheckedVersion(path, meta)


def check_architecture(config: ModuleConfig, meta: ModuleMeta, path: Path) -> None:
    """Raise one line when the version at ``path`` was imported for another module.

    Raises:
        ModelConfigError: naming what differs (factory, kwargs, tables or collections).
    """
    ours = config.architecture()
    differ = [
        k
        for k in ("factory", "kwargs", "tables", "collections")
        if ours.get(k) != meta.architecture.get(k)
    ]
    if differ:
        raise ModelConfigError(
            f"model version {meta.model_version} ({path}) was imported for another module "
            f"(its {', '.join(differ)} differ from model.module's): import it again for this "
            "configuration, or restart with the configuration it was made for"
        )


def verify_module_weights(path: Path) -> dict[str, torch.Tensor]:
    """The weights of the version at ``path`` (mapped), checked against their digest.

    Raises:
        ModelConfigError: unreadable weights, or weights that fail the digest.
    """
    meta = load_module_meta(path)
    try:
        state = load_state_dict(path, map_location="cpu", verify=False, mmap=True)
    except ValueError as exc:
        raise ModelConfigError(str(exc)) from exc
    if meta.weights_sha256 and weights_digest(state) != meta.weights_sha256:
        raise ModelConfigError(
            f"checkpoint weights {path / WEIGHTS_FILE} do not match meta.json's digest"
        )
    return state


def load_module_weights(module: nn.Module, path: Path) -> ModuleMeta:
    """Load the version at ``path`` into ``module`` (strict; the digest is verified).

    Args:
        module: the built module (possibly ``DistributedModelParallel``-wrapped: its load hooks
            copy the shards each rank owns).
        path: the version directory.

    Returns:
        Its metadata.

    Raises:
        ModelConfigError: keys or shapes do not fit, or the weights fail their digest.
    """
    meta = load_module_meta(path)
    state = verify_module_weights(path)
    check_state_dict(getattr(module, "module", module), state, str(path / WEIGHTS_FILE))
    module.load_state_dict(state, strict=True)
    return meta


def import_state_dict(
    config: ModuleConfig,
    source: Path,
    versions: ModelVersions,
    version: str | None = None,
    strip_prefix: str = "",
    metrics: dict[str, float] | None = None,
    overwrite: bool = False,
    promote: bool = False,
) -> ModuleMeta:
    """Bring a plain ``state_dict`` file into ``versions`` as a version of ``config``'s module.

    Args:
        config: the configured module (built on the ``meta`` device to check the file).
        source: the file (``torch.save(model.state_dict(), source)``).
        versions: the versions directory.
        version: its name; default ``<factory name>-<YYYYMMDD>-<first 8 hex of the digest>``.
        strip_prefix: removed from the keys that start with it (``"model."`` for DLRMTrain).
        metrics: recorded in ``meta.json``.
        overwrite: replace a version of that name (never the current one).
        promote: make it current.

    Returns:
        The new version's metadata.

    Raises:
        ModelConfigError: the file is unreadable, or its keys or shapes do not fit the module.
        FileExistsError: the version exists (see :meth:`ModelVersions.add`).
    """
    state = read_state_dict(source, strip_prefix)
    module = build_module(config, "cpu", embedding_device="meta")
    check_state_dict(module, state, str(source))
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    digest = weights_digest(tensors)
    now = dt.datetime.now(dt.UTC)
    short = config.factory.rpartition(":")[2].rpartition(".")[2].lower() or "module"
    name = version or f"{short}-{now:%Y%m%d}-{digest[:8]}"
    meta = {
        "format_version": _FORMAT_VERSION,
        "model_version": name,
        "created_at": now.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "weights_sha256": digest,
        "metrics": {str(k): float(v) for k, v in (metrics or {}).items()},
        "framework_versions": framework_versions(),
        "architecture": config.architecture(),
        "imported_from": str(source),
    }
    with tempfile.TemporaryDirectory(prefix=".import-", dir=versions.root) as staging:
        out = Path(staging) / "version"
        out.mkdir()
        torch.save(tensors, out / WEIGHTS_FILE)
        (out / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        versions.add(out, name, overwrite=overwrite, promote=promote)
    return load_module_meta(versions.path(name))
