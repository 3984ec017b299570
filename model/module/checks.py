"""What a built module holds, and whether it takes the configured input: checked at start-up.

The contract serves modules whose embeddings are

- pooled ``EmbeddingBagCollection`` s (sum or mean over each bag of ids), weighted ones
  (``is_weighted``: the KJT carries a weight per id) included;
- ``EmbeddingCollection`` s (sequence tables: one vector per id, unpooled);
- ``ManagedCollisionEmbeddingBagCollection`` s (raw ids remapped onto the rows by their MCH
  modules, whose state is part of the ``state_dict``), in one process.

Other TorchRec embedding modules are refused in one line:
``FeatureProcessedEmbeddingBagCollection`` (its feature processors compute the weights inside
the module: streamrank carries weights in the KJT instead) and
``ManagedCollisionEmbeddingCollection`` (managed collisions over sequence tables).

:func:`trial_forward` runs the configured module on tables of one row each (cheap whatever the
real sizes): the dense width and the output shape are checked by the module itself.

Example::

    tables = module_tables(module)                    # the planner reads these
    check_features(config, ["user", "item"])          # every KJT key is a module feature
    trial_forward(config, layout)                     # dense width, output shape
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from torchrec.modules.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)

from model.features.layout import InputLayout
from model.features.model_input import sparse_features
from model.module.factory import build_module
from model.module.types import BAG, SEQUENCE, ModelConfigError, ModuleConfig, TableConfig

__all__ = [
    "Collection",
    "check_collections",
    "check_features",
    "collections",
    "managed_collisions",
    "module_tables",
    "trial_forward",
]

Collection: TypeAlias = (
    EmbeddingBagCollection | EmbeddingCollection | ManagedCollisionEmbeddingBagCollection
)
"""An embedding module the contract serves (module docstring)."""

_TRIAL_ROWS = 2
_DENSE_WIDTH_KWARGS = ("dense_in_features", "num_dense_features")
"""Keyword arguments of TorchRec's models that name the dense input's width."""


def collections(module: nn.Module) -> list[tuple[str, Collection]]:
    """Every embedding collection in ``module``, with its path (``""``: the module itself): a
    managed-collision collection once (not its inner ``EmbeddingBagCollection`` again).

    Raises:
        ModelConfigError: the module holds an embedding module the contract does not serve
            (module docstring), or no collection at all.
    """
    found: list[tuple[str, Collection]] = []
    for path, sub in module.named_modules():
        refused = _refused_kind(sub)
        if refused:
            where = path or "the module itself"
            raise ModelConfigError(
                f"model.module: {where} is {refused}; streamrank serves EmbeddingBagCollection "
                "(weighted or not, managed collisions in one process) and EmbeddingCollection "
                "tables"
            )
        inside = any(path.startswith(f"{p}.") for p, c in found if _is_managed(c))
        if (
            isinstance(
                sub,
                (
                    EmbeddingBagCollection,
                    EmbeddingCollection,
                    ManagedCollisionEmbeddingBagCollection,
                ),
            )
            and not inside
        ):
            found.append((path, sub))
    if not found:
        raise ModelConfigError(
            "model.module: the module holds no EmbeddingBagCollection or EmbeddingCollection"
        )
    return found


def _is_managed(collection: nn.Module) -> bool:
    return isinstance(collection, ManagedCollisionEmbeddingBagCollection)


def _inner(collection: Collection) -> EmbeddingBagCollection | EmbeddingCollection:
    """The collection that holds the tables (a managed-collision one's embedding module)."""
    if isinstance(collection, ManagedCollisionEmbeddingBagCollection):
        return collection._embedding_bag_collection
    return collection


def _refused_kind(sub: nn.Module) -> str:
    if isinstance(sub, ManagedCollisionEmbeddingCollection):
        return (
            f"a managed-collision EmbeddingCollection ({type(sub).__name__}: managed "
            "collisions over sequence tables)"
        )
    if isinstance(sub, FeatureProcessedEmbeddingBagCollection):
        return (
            "a FeatureProcessedEmbeddingBagCollection (its feature processors make the weights; "
            "streamrank carries them in the KJT: a weighted EmbeddingBagCollection)"
        )
    return ""


def managed_collisions(module: nn.Module) -> list[str]:
    """The paths of ``module``'s managed-collision collections (``[]``: none)."""
    return [p for p, c in collections(module) if _is_managed(c)]


def check_collections(config: ModuleConfig, module: nn.Module) -> None:
    """The module's weighted collections are what ``config`` declares (the KJT carries weights
    only with ``model.module.weighted``).

    Raises:
        ModelConfigError: a weighted collection without ``weighted = true`` (one line).
    """
    for path, collection in collections(module):
        bag = _inner(collection)
        if isinstance(bag, EmbeddingBagCollection) and bag.is_weighted() and not config.weighted:
            raise ModelConfigError(
                f"model.module: {path or 'the module itself'} is a weighted "
                "EmbeddingBagCollection: set model.module.weighted = true (and each weighted "
                "key's weights)"
            )


def module_tables(
    module: nn.Module, ids_per_key: Mapping[str, int] | None = None
) -> tuple[TableConfig, ...]:
    """The module's own tables, each with the path of its collection (what the planner places).

    Args:
        module: a built module (tables on any device, ``meta`` included).
        ids_per_key: the most ids a row carries per KJT key (the planner's pooling factor);
            keys left out count 1.

    Returns:
        One :class:`TableConfig` per table, collections in module order (a sequence table's
        kind is :data:`~model.module.types.SEQUENCE`).

    Example::

        tables = module_tables(build_module(config, embedding_device="meta"))
    """
    per_key = dict(ids_per_key or {})
    out = []
    for path, collection in collections(module):
        inner = _inner(collection)
        if isinstance(inner, EmbeddingCollection):
            configs: list[Any] = list(inner.embedding_configs())
        else:
            configs = list(inner.embedding_bag_configs())
        for cfg in configs:
            sequence = isinstance(inner, EmbeddingCollection)
            out.append(
                TableConfig(
                    cfg.name,
                    cfg.num_embeddings,
                    cfg.embedding_dim,
                    tuple(cfg.feature_names),
                    pooling="mean" if not sequence and cfg.pooling.name == "MEAN" else "sum",
                    ids_per_row=max((per_key.get(f, 1) for f in cfg.feature_names), default=1),
                    module_path=path,
                    kind=SEQUENCE if sequence else BAG,
                )
            )
    return tuple(out)


def check_features(config: ModuleConfig, keys: Sequence[str]) -> None:
    """Every KJT key is one of the module's embedding features, and every feature has a key.

    Args:
        config: the module config (its tables are the collection streamrank builds).
        keys: the KJT keys the feature map produces.

    Raises:
        ModelConfigError: naming the key.
    """
    features = config.feature_names
    for key in keys:
        if key not in features:
            raise ModelConfigError(
                f"features.sparse.{key}: the module has no embedding feature {key!r} "
                f"(its features: {features})"
            )
    for feature in features:
        if feature not in keys:
            raise ModelConfigError(
                f"model.module.tables: feature {feature!r} has no [features.sparse.{feature}]"
            )


def trial_forward(config: ModuleConfig, layout: InputLayout) -> int:
    """Build the module on one-row tables and run it on two rows of ``layout``.

    Args:
        config: the module config.
        layout: the input the feature map produces (keys, dense width).

    Returns:
        The output's column count (1 for a ``[R]`` output).

    Raises:
        ModelConfigError: the dense width does not fit, or the output is not ``[R]``,
            ``[R, 1]`` or ``[R, T]`` with the columns the output config reads.
    """
    for name in _DENSE_WIDTH_KWARGS:
        width = config.kwargs.get(name)
        if isinstance(width, int) and width != layout.dense_dim:
            raise ModelConfigError(
                f"features.dense: the dense input is {layout.dense_dim} wide but {name} = "
                f"{width} in [model.module.kwargs]"
            )
    tiny = dataclasses.replace(
        config, tables=tuple(dataclasses.replace(t, num_embeddings=1) for t in config.tables)
    )
    module = build_module(tiny, "cpu", seed=0).eval()
    check_collections(config, module)
    rows = _TRIAL_ROWS
    values = rows * len(layout.keys)
    sparse = sparse_features(
        layout.keys,
        torch.zeros(values, dtype=torch.int64),
        torch.ones(values, dtype=torch.int64),
        rows,
        [rows] * len(layout.keys),
        weights=torch.ones(values) if layout.weighted else None,
    )
    try:
        with torch.no_grad():
            out = module(torch.zeros(rows, layout.dense_dim), sparse)
    except Exception as exc:  # a shape error names the mismatch; keep torch's words
        raise ModelConfigError(
            f"features.dense: a trial forward with a dense input {layout.dense_dim} wide "
            f"failed: {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from exc
    return check_output(config, out, rows)


def check_output(config: ModuleConfig, out: object, rows: int) -> int:
    """The output's column count, or a one-line error for an output the contract cannot read."""
    if not isinstance(out, torch.Tensor):
        raise ModelConfigError(
            f"model.module: forward returned {type(out).__name__}, not a Tensor[rows] or "
            "Tensor[rows, T]"
        )
    if out.dim() not in (1, 2) or out.shape[0] != rows:
        raise ModelConfigError(
            f"model.module: forward returned shape {tuple(out.shape)} for {rows} rows; "
            "expected [rows], [rows, 1] or [rows, T]"
        )
    columns = 1 if out.dim() == 1 else int(out.shape[1])
    weights, column = config.output.score_weights, config.output.score_column
    if weights and len(weights) != columns:
        raise ModelConfigError(
            f"model.module.score_weights: {len(weights)} weights for an output of {columns} "
            "column(s)"
        )
    if not weights and column >= columns:
        raise ModelConfigError(
            f"model.module.score_column = {column}: the module returns {columns} column(s)"
        )
    names = config.output.column_names
    if names and len(names) != columns:
        raise ModelConfigError(
            f"model.module.output_names: {len(names)} names for an output of {columns} column(s)"
        )
    return columns
