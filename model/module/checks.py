"""What a built module holds, and whether it takes the configured input: checked at start-up.

The contract serves modules whose embeddings are pooled ``EmbeddingBagCollection`` s (sum or
mean over each bag of ids); other TorchRec embedding modules are refused in one line:

- ``EmbeddingCollection`` (sequence embeddings, one vector per id): the pipeline builds one bag
  per row and key, not sequences;
- managed-collision modules (``ManagedCollisionEmbeddingBagCollection`` and friends): their id
  remapping state is not loaded or swapped by streamrank;
- weighted features (``is_weighted`` collections, ``FeatureProcessedEmbeddingBagCollection``):
  the feature map carries ids, not (id, score) pairs.

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

import torch
from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from torchrec.modules.mc_embedding_modules import BaseManagedCollisionEmbeddingCollection

from model.features.layout import InputLayout
from model.features.model_input import sparse_features
from model.module.factory import build_module
from model.module.types import ModelConfigError, ModuleConfig, TableConfig

__all__ = ["check_features", "collections", "module_tables", "trial_forward"]

_TRIAL_ROWS = 2
_DENSE_WIDTH_KWARGS = ("dense_in_features", "num_dense_features")
"""Keyword arguments of TorchRec's models that name the dense input's width."""


def collections(module: nn.Module) -> list[tuple[str, EmbeddingBagCollection]]:
    """Every ``EmbeddingBagCollection`` in ``module``, with its path (``""``: the module itself).

    Raises:
        ModelConfigError: the module holds an embedding module the contract does not serve
            (module docstring), or no collection at all.
    """
    found: list[tuple[str, EmbeddingBagCollection]] = []
    for path, sub in module.named_modules():
        refused = _refused_kind(sub)
        if refused:
            where = path or "the module itself"
            raise ModelConfigError(
                f"model.module: {where} is {refused}; streamrank serves pooled "
                "EmbeddingBagCollection tables (unweighted) only"
            )
        if isinstance(sub, EmbeddingBagCollection):
            found.append((path, sub))
    if not found:
        raise ModelConfigError("model.module: the module holds no EmbeddingBagCollection")
    return found


def _refused_kind(sub: nn.Module) -> str:
    if isinstance(sub, BaseManagedCollisionEmbeddingCollection):
        return f"a managed-collision module ({type(sub).__name__})"
    if isinstance(sub, FeatureProcessedEmbeddingBagCollection):
        return "a FeatureProcessedEmbeddingBagCollection (weighted features)"
    if isinstance(sub, EmbeddingCollection):
        return "an EmbeddingCollection (sequence embeddings)"
    if isinstance(sub, EmbeddingBagCollection) and sub.is_weighted():
        return "a weighted EmbeddingBagCollection (id_score_list features)"
    return ""


def module_tables(
    module: nn.Module, ids_per_key: Mapping[str, int] | None = None
) -> tuple[TableConfig, ...]:
    """The module's own tables, each with the path of its collection (what the planner places).

    Args:
        module: a built module (tables on any device, ``meta`` included).
        ids_per_key: the most ids a row carries per KJT key (the planner's pooling factor);
            keys left out count 1.

    Returns:
        One :class:`TableConfig` per table, collections in module order.

    Example::

        tables = module_tables(build_module(config, embedding_device="meta"))
    """
    per_key = dict(ids_per_key or {})
    out = []
    for path, ebc in collections(module):
        for cfg in ebc.embedding_bag_configs():
            out.append(
                TableConfig(
                    cfg.name,
                    cfg.num_embeddings,
                    cfg.embedding_dim,
                    tuple(cfg.feature_names),
                    pooling="mean" if cfg.pooling.name == "MEAN" else "sum",
                    ids_per_row=max((per_key.get(f, 1) for f in cfg.feature_names), default=1),
                    module_path=path,
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
    rows = _TRIAL_ROWS
    sparse = sparse_features(
        layout.keys,
        torch.zeros(rows * len(layout.keys), dtype=torch.int64),
        torch.ones(rows * len(layout.keys), dtype=torch.int64),
        rows,
        [rows] * len(layout.keys),
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
