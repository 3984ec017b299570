"""Sharded checkpoints of the ranker with ``torch.distributed.checkpoint`` (DCP).

Layout of a sharded checkpoint directory::

    <path>/
      meta.json        the same metadata as model/store/checkpoint.py (model_version, spec, ...)
                       plus "weights_format": "dcp" and "world_size"; weights_sha256 is ""
      .metadata        DCP's index: every tensor's global shape and where its shards are
                       (read by :mod:`model.store.dcp_reader`, which unpickles DCP's own
                       classes only and refuses byte items: loading runs nothing from here)
      __<r>_0.distcp   the shards rank r wrote (replicated tensors are written once)

The tensors' names are those of the unsharded ``Ranker.state_dict()`` (DMP strips its wrapper
prefixes), and DCP reshards on load, so a checkpoint written by any world size and sharding
plan loads into any other one, and into a plain single-process :class:`~model.ranker.Ranker`.
:func:`load_sharded` also accepts a single-process checkpoint of :mod:`model.store.checkpoint`
(``model.pt``), so the checkpoint ``init-model`` writes serves a sharded job directly, and
:func:`export_unsharded` converts a sharded checkpoint back into that single-process format.

:func:`model.store.checkpoint.load_meta` / ``load_spec`` read either kind of directory.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from model.features.spec import FeatureSpec
from model.ranker import Ranker, build_ranker
from model.store.checkpoint import (
    META_FILE,
    WEIGHTS_FILE,
    CheckpointMeta,
    load_checkpoint,
    load_meta,
    load_state_dict,
    new_meta,
    replace_dir,
    save_checkpoint,
)
from model.store.dcp_reader import load_dcp, single_process_ok
from model.store.version_info import DCP_INDEX_FILE

#: ``meta.json``'s ``weights_format`` of a sharded checkpoint.
WEIGHTS_FORMAT_DCP = "dcp"


def checkpoint_format(path: str | os.PathLike[str]) -> str:
    """Which kind of checkpoint ``path`` holds.

    Args:
        path: a checkpoint directory.

    Returns:
        ``"dcp"`` (sharded, written by :func:`save_sharded`) or ``"torch"`` (single-process,
        written by :func:`model.store.checkpoint.save_checkpoint`).

    Raises:
        FileNotFoundError: if the directory holds neither.

    Example::

        if checkpoint_format(path) == "dcp":
            export_unsharded(path, path + "-single")
    """
    root = Path(path)
    if (root / DCP_INDEX_FILE).is_file():
        return WEIGHTS_FORMAT_DCP
    if (root / WEIGHTS_FILE).is_file():
        return "torch"
    raise FileNotFoundError(
        f"no checkpoint weights in {root} (neither {DCP_INDEX_FILE} nor {WEIGHTS_FILE})"
    )


def _rank(pg: dist.ProcessGroup | None) -> int:
    return dist.get_rank(pg) if dist.is_initialized() else 0


def _broadcast(obj: Any, pg: dist.ProcessGroup | None) -> Any:
    """Rank 0's ``obj`` on every rank (no-op without a process group)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    src = dist.get_global_rank(pg, 0) if pg is not None else 0
    dist.broadcast_object_list(box, src=src, group=pg)
    return box[0]


def _module_spec(model: nn.Module) -> FeatureSpec | None:
    inner = getattr(model, "module", model)  # DistributedModelParallel.module is the Ranker
    return inner.spec if isinstance(inner, Ranker) else None


def save_sharded(
    dmp: nn.Module,
    spec: FeatureSpec,
    path: str | os.PathLike[str],
    model_version: str | None = None,
    metrics: dict[str, float] | None = None,
    overwrite: bool = False,
    pg: dist.ProcessGroup | None = None,
) -> CheckpointMeta:
    """Write the sharded model to the directory ``path`` (collective: every rank calls it).

    Every rank writes its own shards into a temporary sibling directory (the file system must
    be shared by the ranks, as it is on one host); rank 0 then writes ``meta.json`` and renames
    the directory into place, so readers never see a half-written checkpoint. Works in a
    single process without a process group too (e.g. for a plain :class:`Ranker`).

    Args:
        dmp: the ``DistributedModelParallel`` ranker (or a plain :class:`Ranker`).
        spec: the spec it was built from.
        path: the checkpoint directory to create.
        model_version: defaults to ``dlrm-<UTC date YYYYMMDD>-<8 random hex digits>``
            (the weights are not gathered, so there is no weights digest to derive it from).
        metrics: e.g. ``{"auc": 0.87}``.
        overwrite: replace an existing checkpoint at ``path`` (else it is an error).
        pg: the process group (default: the global one).

    Returns:
        The written :class:`~model.store.checkpoint.CheckpointMeta` (the same on every rank).

    Raises:
        FileExistsError: on every rank, if ``path`` exists and ``overwrite`` is False.
        ValueError: if ``spec`` differs from the model's.

    Example::

        save_sharded(dmp, spec, "artifacts/ckpt-sharded", metrics={"auc": 0.87})
    """
    target = Path(path)
    own_spec = _module_spec(dmp)
    if own_spec is not None and own_spec != spec:
        raise ValueError("spec differs from the spec the ranker was built with")
    rank = _rank(pg)
    world_size = dist.get_world_size(pg) if dist.is_initialized() else 1

    plan: dict[str, Any] | None = None
    if rank == 0:
        if target.exists() and not overwrite:
            plan = {"error": f"checkpoint path already exists: {target}"}
        else:
            meta = new_meta(
                spec, model_version, metrics, weights_sha256="", version_suffix=uuid.uuid4().hex[:8]
            )
            tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:12]}"
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            plan = {"tmp": str(tmp), "meta": meta.to_dict()}
    plan = _broadcast(plan, pg)
    assert plan is not None
    if "error" in plan:
        raise FileExistsError(plan["error"])
    tmp = Path(plan["tmp"])
    meta = CheckpointMeta.from_dict(plan["meta"])

    failed: str | None = None
    try:
        with single_process_ok():
            dcp.save(
                dmp.state_dict(),
                checkpoint_id=tmp,
                process_group=pg,
                no_dist=not dist.is_initialized(),
            )
    except Exception as exc:  # report on every rank, clean up on rank 0
        failed = f"rank {rank}: {exc!r}"
    failures = _gather_failures(failed, pg)
    if rank == 0:
        if failures:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            try:
                data = meta.to_dict() | {
                    "weights_format": WEIGHTS_FORMAT_DCP,
                    "world_size": world_size,
                }
                (tmp / META_FILE).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
                replace_dir(tmp, target)
            except BaseException as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                failures = [f"rank 0: {exc!r}"]
    failures = _broadcast(failures, pg)
    if failures:
        raise RuntimeError(f"sharded checkpoint {target} not written: {'; '.join(failures)}")
    return meta


def _gather_failures(failed: str | None, pg: dist.ProcessGroup | None) -> list[str]:
    if not dist.is_initialized():
        return [failed] if failed else []
    gathered: list[str | None] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(gathered, failed, group=pg)
    return [f for f in gathered if f]


def load_sharded(
    dmp: nn.Module,
    path: str | os.PathLike[str],
    pg: dist.ProcessGroup | None = None,
) -> CheckpointMeta:
    """Load a checkpoint into the (sharded) model; collective for sharded checkpoints.

    - a DCP checkpoint (:func:`save_sharded`) written by any world size and plan: every rank
      reads the parts of every tensor that its shards cover (DCP reshards);
    - a single-process checkpoint (:func:`model.store.checkpoint.save_checkpoint`, ``model.pt``):
      every rank maps the whole file on the host (weights digest verified) and copies only
      the slices it owns to its device; the mapping is page cache shared by the ranks, not a
      private copy per rank, and no full table is ever on a GPU.

    Also works for a plain :class:`Ranker` in a process without a process group.

    Args:
        dmp: the ``DistributedModelParallel`` ranker (from
            :func:`model.distributed.runtime.shard_ranker`) or a plain :class:`Ranker`.
        path: the checkpoint directory.
        pg: the process group (default: the global one; ignored without one).

    Returns:
        The checkpoint's :class:`~model.store.checkpoint.CheckpointMeta`.

    Raises:
        FileNotFoundError: if the directory, ``meta.json`` or the weights are missing.
        ValueError: if the checkpoint's spec differs from the model's, or the weights do not
            fit the model.

    Example::

        dmp = shard_ranker(load_spec(path), plan, device)
        meta = load_sharded(dmp, path)
    """
    meta = load_meta(path)
    own_spec = _module_spec(dmp)
    if own_spec is not None and own_spec != meta.spec:
        raise ValueError(f"checkpoint {path} was written for another FeatureSpec than the model's")
    fmt = checkpoint_format(path)
    if fmt == WEIGHTS_FORMAT_DCP:
        state = dmp.state_dict()
        try:
            load_dcp(state, path, collective=True, process_group=pg)
        except Exception as exc:  # DCP wraps per-rank failures in CheckpointException
            raise ValueError(f"cannot load sharded checkpoint {path}: {exc}") from exc
    else:
        # Mapped on the host, never moved whole: the sharded modules' load hooks slice each
        # full table to the shards this rank owns (views of the shared page cache), and only
        # those slices are copied to the rank's device.
        state = load_state_dict(path, map_location="cpu", mmap=True)
    try:
        result = dmp.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"checkpoint {path} does not fit the model: {exc}") from exc
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"checkpoint {path} does not fit the model: missing {result.missing_keys}, "
            f"unexpected {result.unexpected_keys}"
        )
    return meta


def load_ranker(path: str | os.PathLike[str]) -> tuple[Ranker, CheckpointMeta]:
    """A plain CPU :class:`Ranker` (eval mode) from either kind of checkpoint, no process group.

    Args:
        path: a sharded or single-process checkpoint directory.

    Returns:
        ``(ranker, metadata)``.

    Example::

        ranker, meta = load_ranker("artifacts/ckpt-sharded")
    """
    if checkpoint_format(path) != WEIGHTS_FORMAT_DCP:
        return load_checkpoint(path)
    meta = load_meta(path)
    ranker = build_ranker(meta.spec, device="cpu")
    state = ranker.state_dict()
    try:
        load_dcp(state, path)
    except Exception as exc:
        raise ValueError(f"cannot load sharded checkpoint {path}: {exc}") from exc
    ranker.load_state_dict(state, strict=True)
    ranker.eval()
    return ranker, meta


def export_unsharded(
    path_in: str | os.PathLike[str],
    path_out: str | os.PathLike[str],
    overwrite: bool = False,
) -> CheckpointMeta:
    """Convert a checkpoint (sharded or not) into a single-process :mod:`model.store.checkpoint`
    one.

    Runs in one process and uses no collectives (safe to call on one rank of a running job):
    the full weights are read into a CPU :class:`Ranker` and written with
    :func:`model.store.checkpoint.save_checkpoint`, keeping ``model_version`` and ``metrics`` (the
    weights digest is computed afresh).

    Args:
        path_in: the checkpoint to convert.
        path_out: the single-process checkpoint directory to create.
        overwrite: replace an existing ``path_out``.

    Returns:
        The written metadata.

    Raises:
        FileExistsError: if ``path_out`` exists and ``overwrite`` is False.
        FileNotFoundError, ValueError: if ``path_in`` is missing or unreadable.

    Example::

        export_unsharded("artifacts/ckpt-sharded", "artifacts/ckpt")
        ranker, meta = load_checkpoint("artifacts/ckpt")
    """
    if Path(path_out).exists() and not overwrite:
        raise FileExistsError(f"checkpoint path already exists: {path_out}")
    ranker, meta = load_ranker(path_in)
    return save_checkpoint(
        ranker,
        meta.spec,
        path_out,
        model_version=meta.model_version,
        metrics=meta.metrics,
        overwrite=overwrite,
    )
