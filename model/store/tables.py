"""Embedding tables as numpy arrays, read from a checkpoint or a plain ranker.

Retrieval (:mod:`model.retrieval.index`) needs the item table (the vectors it indexes) and the
event-side tables (the query). It reads them straight from the checkpoint directory instead of
from the served model, because the served model may be quantized, compiled or sharded across
ranks (no rank holds a whole table then); the files hold the full fp32 tables in every case:

- a single-process checkpoint (``model.pt``) is memory-mapped, so only the tables asked for
  are read, and they share the page cache with the scorer's own load;
- a sharded checkpoint (DCP) is read for just those tensors, in this process only
  (``no_dist``: no collective, safe on a background thread of any rank), through
  :mod:`model.store.dcp_reader` (its index is unpickled with DCP's own classes only).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from model.features.spec import FeatureSpec, SparseFeature
from model.ranker import Ranker
from model.store.checkpoint import load_meta, load_state_dict
from model.store.version_info import DCP_INDEX_FILE

__all__ = ["DCP_INDEX_FILE", "EmbeddingTables", "table_state_key"]


Float32Array = npt.NDArray[np.float32]


def table_state_key(spec: FeatureSpec, feature: SparseFeature) -> str:
    """The unsharded ``Ranker.state_dict()`` key of ``feature``'s table weights.

    Example::

        table_state_key(spec, SparseFeature.ITEM_ID)
        # 'model.sparse_arch.embedding_bag_collection.embedding_bags.t_item_id.weight'
    """
    name = spec.table(feature).name
    return f"model.sparse_arch.embedding_bag_collection.embedding_bags.{name}.weight"


@dataclass(frozen=True)
class EmbeddingTables:
    """Some embedding tables of one model, float32 ``[num_embeddings, embedding_dim]`` each.

    Attributes:
        spec: the model's feature spec (table sizes, id hashing).
        model_version: the model's version (``""`` for an unsaved ranker).
        tables: feature -> its table (possibly a read-only view of a mapped file).

    Example::

        tables = EmbeddingTables.from_checkpoint(path, [SparseFeature.USER_ID,
                                                        SparseFeature.ITEM_ID])
        item_vectors = tables.rows(SparseFeature.ITEM_ID, raw_item_ids)
    """

    spec: FeatureSpec
    model_version: str
    tables: Mapping[SparseFeature, Float32Array]

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike[str], features: Iterable[SparseFeature]
    ) -> EmbeddingTables:
        """Read ``features``' tables from a checkpoint directory (either format).

        Args:
            path: the checkpoint directory.
            features: the tables to read.

        Returns:
            The tables (fp32, on the CPU).

        Raises:
            FileNotFoundError: if the directory, its metadata or its weights are missing.
            ValueError: if a file is corrupt or lacks a table of the spec's shape.
        """
        root = Path(path)
        meta = load_meta(root)
        spec = meta.spec
        wanted = list(dict.fromkeys(features))
        shapes = {f: (spec.table(f).num_embeddings, spec.embedding_dim) for f in wanted}
        if (root / DCP_INDEX_FILE).is_file():
            found = _read_dcp(root, {table_state_key(spec, f): shapes[f] for f in wanted})
        else:
            state = load_state_dict(root, verify=False, mmap=True)
            found = {k: state[k] for k in (table_state_key(spec, f) for f in wanted) if k in state}
        tables: dict[SparseFeature, Float32Array] = {}
        for feature in wanted:
            tensor = found.get(table_state_key(spec, feature))
            if tensor is None or tuple(tensor.shape) != shapes[feature]:
                got = None if tensor is None else tuple(tensor.shape)
                raise ValueError(
                    f"checkpoint {root}: table {spec.table(feature).name} is {got}, "
                    f"expected {shapes[feature]}"
                )
            tables[feature] = tensor.detach().to(torch.float32).numpy()
        return cls(spec, meta.model_version, tables)

    @classmethod
    def from_ranker(
        cls, ranker: Ranker, features: Iterable[SparseFeature], model_version: str = ""
    ) -> EmbeddingTables:
        """Copy ``features``' tables out of an unsharded, unquantized ranker.

        Args:
            ranker: the model (tables materialised, on any device).
            features: the tables to copy.
            model_version: recorded on the result.

        Returns:
            The tables (fp32 copies on the CPU).
        """
        bags = ranker.embedding_bag_collection.embedding_bags
        tables = {
            f: bags[ranker.spec.table(f).name].weight.detach().to("cpu", torch.float32).numpy()
            for f in dict.fromkeys(features)
        }
        return cls(ranker.spec, model_version, tables)

    @property
    def dim(self) -> int:
        """The embedding width."""
        return self.spec.embedding_dim

    def rows(self, feature: SparseFeature, raw_ids: npt.NDArray[np.int64]) -> Float32Array:
        """The vectors of raw ids (hashed into ``feature``'s table as the ranker does).

        Args:
            feature: a feature whose table was read.
            raw_ids: int64[N] raw ids.

        Returns:
            float32[N, dim], a new contiguous array.
        """
        table = self.tables[feature]
        return np.ascontiguousarray(table[self.spec.hash_ids(feature, raw_ids)])


def _read_dcp(root: Path, shapes: Mapping[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """The named fp32 tensors of a DCP checkpoint, read in this process only (through
    :mod:`model.store.dcp_reader`: nothing in the directory is run)."""
    from model.store.dcp_reader import load_dcp

    state = {key: torch.empty(shape, dtype=torch.float32) for key, shape in shapes.items()}
    try:
        load_dcp(state, root)
    except Exception as exc:  # DCP raises CheckpointException and friends
        raise ValueError(f"cannot read tables of sharded checkpoint {root}: {exc}") from exc
    return state
