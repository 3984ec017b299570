"""Reading sharded (DCP) checkpoints without running anything from the directory.

``torch.distributed.checkpoint``'s own ``FileSystemReader`` unpickles the index file
(``.metadata``) with plain :mod:`pickle`, and its default load planner reads "byte items" with
``torch.load(weights_only=False)``: either runs whatever code the directory's author put there,
in the serving process. A digest kept in the same directory proves nothing (whoever writes the
pickle writes the digest), so the files themselves are read with less trust:

- :func:`read_dcp_index` unpickles ``.metadata`` with an unpickler that resolves only the
  classes DCP's own index is made of (:data:`ALLOWED_GLOBALS`: the dataclasses of
  ``torch.distributed.checkpoint.metadata``, ``_StorageInfo``, ``torch.Size``, torch dtypes and
  layouts, paths) and plain containers; anything else (``os.system``, ``builtins.eval``, a
  module's function...) stops the read before it is called. It then checks what the index
  says: tensors only (no byte items), shard files that are plain names inside the directory,
  no stream transforms (streamrank never writes them).
- :class:`SafeFileSystemReader` is DCP's reader with that index read;
  :class:`TensorsOnlyLoadPlanner` refuses byte items should one get past the index check. The
  tensors themselves are read by DCP with ``torch.load(weights_only=True)``.
- :func:`load_dcp` is ``dcp.load`` with both; every reader of a sharded checkpoint in
  streamrank goes through it (the sharded load, :mod:`model.store.tables`, ``model import``).

The allow-list covers the index as torch 2.11 and 2.13 write it (their ``metadata.py`` define
the same classes; checked against both installed versions).

Example::

    state = ranker.state_dict()
    load_dcp(state, "artifacts/ckpt-sharded")      # no process group: this process only
    read_dcp_index("artifacts/ckpt-sharded")       # raises UnsafeCheckpoint on a foreign pickle
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem

from model.store.version_info import DCP_INDEX_FILE

__all__ = [
    "ALLOWED_GLOBALS",
    "DCP_INDEX_FILE",
    "SafeFileSystemReader",
    "TensorsOnlyLoadPlanner",
    "UnsafeCheckpoint",
    "load_dcp",
    "read_dcp_index",
    "single_process_ok",
]

_METADATA = "torch.distributed.checkpoint.metadata"
#: ``(module, name)`` of every global the index pickle may name: DCP's index classes and the
#: values they hold. ``torch.serialization._get_layout`` only looks a layout up by its name.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        (_METADATA, "Metadata"),
        (_METADATA, "MetadataIndex"),
        (_METADATA, "StorageMeta"),
        (_METADATA, "TensorStorageMetadata"),
        (_METADATA, "TensorProperties"),
        (_METADATA, "ChunkStorageMetadata"),
        (_METADATA, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
    }
)


class UnsafeCheckpoint(ValueError):
    """A sharded checkpoint whose index names something besides DCP's own classes, or asks
    for what streamrank never loads (byte items, files outside the directory)."""


class _IndexUnpickler(pickle.Unpickler):
    """Resolves only :data:`ALLOWED_GLOBALS` and torch dtypes; nothing else is imported."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a DCP index never holds")


def read_dcp_index(path: str | os.PathLike[str]) -> Metadata:
    """The index (``.metadata``) of the sharded checkpoint ``path``, read without trusting it.

    Args:
        path: the checkpoint directory.

    Returns:
        DCP's :class:`~torch.distributed.checkpoint.metadata.Metadata`.

    Raises:
        FileNotFoundError: no index in ``path``.
        UnsafeCheckpoint: the index names a class or function outside :data:`ALLOWED_GLOBALS`,
            holds byte items, points outside the directory or is not a DCP index.

    Example::

        meta = read_dcp_index("artifacts/ckpt-sharded")
        sorted(meta.state_dict_metadata)[:2]
    """
    index = Path(path) / DCP_INDEX_FILE
    with open(index, "rb") as file:
        try:
            metadata = _IndexUnpickler(file).load()
        except Exception as exc:  # UnpicklingError, and whatever a garbled pickle raises
            raise UnsafeCheckpoint(f"refused sharded checkpoint index {index}: {exc}") from exc
    _check_index(metadata, index)
    return metadata


def _check_index(metadata: Any, index: Path) -> None:
    """What the index asks to read: tensors, from plain files of its directory."""

    def refuse(why: str) -> UnsafeCheckpoint:
        return UnsafeCheckpoint(f"refused sharded checkpoint index {index}: {why}")

    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise refuse(f"not a DCP index ({type(metadata).__name__})")
    for fqn, item in metadata.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            raise refuse(f"{fqn!r} is not a tensor ({type(item).__name__})")
    if not isinstance(metadata.storage_data, dict):
        raise refuse("no storage table")
    for key, info in metadata.storage_data.items():
        if not isinstance(key, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise refuse("a storage entry of an unknown kind")
        name = info.relative_path
        if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
            raise refuse(f"shard file {name!r} is not a plain file name of the directory")
        if info.transform_descriptors:
            raise refuse(f"shard {name!r} asks for stream transforms {info.transform_descriptors}")
    if metadata.storage_meta is not None and not isinstance(metadata.storage_meta, StorageMeta):
        raise refuse("storage_meta of an unknown kind")


class SafeFileSystemReader(FileSystemReader):
    """DCP's file-system reader with the index read by :func:`read_dcp_index`.

    Args:
        path: the checkpoint directory.
    """

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The checked index (DCP's ``rank``-local index files are never read)."""
        if kwargs.get("rank") is not None:
            raise UnsafeCheckpoint("rank-local DCP index files are not read")
        metadata = read_dcp_index(Path(self.path))
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class TensorsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that byte items (pickles DCP would read with
    ``torch.load(weights_only=False)``) are refused."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Refuse: a streamrank checkpoint holds tensors only."""
        raise UnsafeCheckpoint(
            f"refused byte item {read_item.dest_index.fqn!r}: streamrank loads tensors only"
        )


@contextlib.contextmanager
def single_process_ok() -> Iterator[None]:
    """Silence DCP's "assuming the intent is to save/load in a single process" warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to .* single process")
        yield


def load_dcp(
    state: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    collective: bool = False,
    process_group: dist.ProcessGroup | None = None,
) -> None:
    """``dcp.load`` into ``state`` (in place) through the checked reader and planner.

    Args:
        state: the state dict to fill (its tensors, or sharded tensors, say what to read).
        path: the checkpoint directory.
        collective: every rank of the initialized process group calls this together (a
            sharded model); ``False``: this process alone reads what ``state`` asks for (no
            collective, safe on a background thread of any rank).
        process_group: with ``collective``, the group (default: the global one).

    Raises:
        UnsafeCheckpoint: as :func:`read_dcp_index` (raised before anything is read).
        Exception: whatever DCP raises on unreadable shards (``CheckpointException``).
    """
    read_dcp_index(path)  # refused here, before DCP logs its fallback to rank-local indexes
    with single_process_ok():
        dcp.load(
            state,
            storage_reader=SafeFileSystemReader(Path(path)),
            planner=TensorsOnlyLoadPlanner(),
            process_group=process_group,
            no_dist=not (collective and dist.is_initialized()),
        )
