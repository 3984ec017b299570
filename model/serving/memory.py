"""Bytes of embedding-table storage a process holds: plain, quantized or sharded tables."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import torch
from torch import nn

__all__ = ["embedding_bytes"]

# Weight buffers of FBGEMM's table-batched embedding modules (fused, dense and quantized).
_TBE_WEIGHT_ATTRS = ("weights_host", "weights_dev", "weights_uvm", "weights")


def embedding_bytes(module: nn.Module) -> int:
    """Bytes of embedding-table storage held in ``module`` by this process.

    Counts the weights of ``nn.EmbeddingBag``/``nn.Embedding`` modules and the weight buffers
    of FBGEMM table-batched kernels, so a plain ranker, a quantized one and this rank's shards
    of a ``DistributedModelParallel`` model (fused and data-parallel tables, whose kernels
    TorchRec keeps outside the module tree) all count. Of a
    ``ShardedTensor`` weight only the local shards count, of a ``DTensor`` only the local
    tensor; every storage once; tensors on the meta device count zero.

    Args:
        module: a ranker, quantized ranker, sharded model or any module containing tables.

    Returns:
        Bytes, including the per-row scale/bias and the row and table alignment padding of
        quantized tables.

    Example::

        embedding_bytes(build_ranker(FeatureSpec()))  # 77_137_920 (301_320 rows x 64 x 4)
        log.info("rank holds %.1f MiB of tables", embedding_bytes(dmp) / 2**20)
    """
    seen: set[int] = set()
    total = 0
    for mod in _table_holders(module):
        for weight in _table_weights(mod):
            for t in _local_tensors(weight):
                if t.is_meta or t.numel() == 0 or t.data_ptr() in seen:
                    continue
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def _table_holders(module: nn.Module) -> Iterator[nn.Module]:
    """Every submodule, including the lookup kernels of TorchRec's sharded collections, which
    keep them in a plain list (``_lookups``) outside the module tree."""
    for mod in module.modules():
        yield mod
        lookups = getattr(mod, "_lookups", None)
        if isinstance(lookups, list):
            for lookup in lookups:
                if isinstance(lookup, nn.Module):
                    yield from _table_holders(lookup)


def _table_weights(mod: nn.Module) -> list[object]:
    if isinstance(mod, nn.EmbeddingBag | nn.Embedding):
        return [mod.weight]
    if "TableBatchedEmbedding" in type(mod).__name__:
        return [getattr(mod, attr, None) for attr in _TBE_WEIGHT_ATTRS]
    return []


def _local_tensors(value: object) -> list[torch.Tensor]:
    """The tensors of ``value`` held by this process (its shards, for distributed tensors)."""
    local_shards = getattr(value, "local_shards", None)
    if callable(local_shards):  # ShardedTensor
        return [s.tensor for s in local_shards()]
    to_local = getattr(value, "to_local", None)
    if callable(to_local):  # DTensor
        return [cast(torch.Tensor, to_local())]
    if isinstance(value, torch.Tensor):
        return [value]
    return []
