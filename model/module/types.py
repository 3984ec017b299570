"""The served module, described as plain data (no torch import: configuration code uses it).

A *module* is any ``torch.nn.Module`` with TorchRec's ranking forward::

    forward(dense_features: Tensor[R, D], sparse_features: KeyedJaggedTensor) -> Tensor

returning ``[R]``, ``[R, 1]`` or ``[R, T]``. It is built by an importable factory
(``"package.module:function"``) called with the keyword arguments of :attr:`ModuleConfig.kwargs`
and, under :attr:`ModuleConfig.collection_argument`, an ``EmbeddingBagCollection`` that
streamrank builds from :attr:`ModuleConfig.tables` (:mod:`model.module.factory`).

Example::

    config = ModuleConfig(
        factory="torchrec.models.deepfm:SimpleDeepFMNN",
        kwargs={"num_dense_features": 3, "hidden_layer_size": 16, "deep_fm_dimension": 4},
        tables=(TableConfig("t_user", 1000, 8, ("user",)),),
        output=OutputConfig(activation=Activation.PROBABILITIES),
    )
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Activation",
    "ModelConfigError",
    "ModuleConfig",
    "OutputConfig",
    "TableConfig",
    "table_names",
]


class ModelConfigError(ValueError):
    """A mistake in the configured model, told in one line naming the key (the CLI prints it and
    exits with code 2)."""


class Activation(enum.StrEnum):
    """What the module's output holds."""

    LOGITS = "logits"
    """Raw logits (``torchrec.models.dlrm.DLRM``): scores are their sigmoid."""
    PROBABILITIES = "probabilities"
    """Probabilities already (``SimpleDeepFMNN`` ends in a sigmoid): used as they are."""


@dataclass(frozen=True)
class TableConfig:
    """One embedding table of the module.

    Attributes:
        name: the table's name (unique in the module; the sharding plan's key).
        num_embeddings: rows.
        embedding_dim: columns.
        feature_names: the KJT keys that look this table up.
        pooling: ``sum`` or ``mean`` (pooled lookups: an ``EmbeddingBagCollection``).
        ids_per_row: ids one scored row looks up in it at most (the planner's pooling factor;
            1 for a single-valued feature).
        module_path: where its collection sits inside the module (e.g.
            ``sparse_arch.embedding_bag_collection``; ``""`` until the module is built).

    Example::

        TableConfig("t_item", 100_000, 64, ("item",))
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...]
    pooling: str = "sum"
    ids_per_row: int = 1
    module_path: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ModelConfigError("a table needs a name")
        if self.num_embeddings < 1 or self.embedding_dim < 1:
            raise ModelConfigError(
                f"table {self.name}: num_embeddings and embedding_dim must be >= 1"
            )
        if not self.feature_names:
            raise ModelConfigError(f"table {self.name}: features must name at least one key")
        if self.pooling not in ("sum", "mean"):
            raise ModelConfigError(f"table {self.name}: pooling must be sum or mean")
        object.__setattr__(self, "feature_names", tuple(self.feature_names))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the architecture recorded with a module version)."""
        return {
            "name": self.name,
            "num_embeddings": self.num_embeddings,
            "embedding_dim": self.embedding_dim,
            "features": list(self.feature_names),
            "pooling": self.pooling,
        }


@dataclass(frozen=True)
class OutputConfig:
    """How the module's output becomes one ranking score per row.

    Attributes:
        activation: logits (sigmoid applied) or probabilities (used as they are).
        score_column: the column of a ``[R, T]`` output that ranks (ignored with weights).
        score_weights: a weighted sum of the ``T`` columns ranks instead (after the
            activation); ``()``: one column.
        task_columns: columns carried beside the ranking score for the kept items (after the
            activation), in this order: the task scores a configured output schema publishes
            by name; ``()``: none (the built-in Recommendation carries the ranking score only).
        column_names: the name of every output column (``model.module.output_names``);
            ``()``: unnamed.

    Example::

        OutputConfig(Activation.LOGITS, score_weights=(0.8, 0.2))  # two tasks
        OutputConfig(Activation.LOGITS, score_weights=(0.8, 0.2), task_columns=(0, 1))
    """

    activation: Activation = Activation.LOGITS
    score_column: int = 0
    score_weights: tuple[float, ...] = ()
    task_columns: tuple[int, ...] = ()
    column_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "activation", Activation(self.activation))
        object.__setattr__(self, "score_weights", tuple(float(w) for w in self.score_weights))
        object.__setattr__(self, "task_columns", tuple(int(c) for c in self.task_columns))
        object.__setattr__(self, "column_names", tuple(self.column_names))
        if self.score_column < 0:
            raise ModelConfigError("model.module.score_column must be >= 0")
        if any(c < 0 for c in self.task_columns):
            raise ModelConfigError("model.module: a published task column must be >= 0")
        names = self.column_names
        if len(set(names)) != len(names) or not all(names):
            raise ModelConfigError(
                f"model.module.output_names = {list(names)}: names must be distinct and not empty"
            )

    @property
    def columns_needed(self) -> int:
        """The fewest output columns this config can read."""
        ranked = len(self.score_weights) if self.score_weights else self.score_column + 1
        return max(ranked, len(self.column_names), *(c + 1 for c in self.task_columns))


@dataclass(frozen=True)
class ModuleConfig:
    """The module to serve: how to build it and how to read its output.

    Attributes:
        factory: ``"package.module:function"`` (any callable: a class too).
        kwargs: keyword arguments of the factory (TOML values).
        tables: the tables of the collection streamrank builds, in KJT key order.
        collection_argument: the keyword the ``EmbeddingBagCollection`` is passed under.
        output: how the output ranks.
        code_dir: a directory put first on the import path for the factory's package (the
            user's own code; never a model version directory); ``""``: installed packages only.
        device_argument: a keyword the factory takes the dense layers' device under (e.g.
            ``dense_device`` of TorchRec's DLRM); ``""``: the module is moved after building.

    Example::

        ModuleConfig("torchrec.models.dlrm:DLRM", {"dense_in_features": 4, ...}, tables)
    """

    factory: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    tables: tuple[TableConfig, ...] = ()
    collection_argument: str = "embedding_bag_collection"
    output: OutputConfig = field(default_factory=OutputConfig)
    code_dir: str = ""
    device_argument: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "tables", tuple(self.tables))
        object.__setattr__(self, "kwargs", dict(self.kwargs))
        if ":" not in self.factory:
            raise ModelConfigError(
                f"model.module.factory {self.factory!r} must be 'package.module:function'"
            )
        if not self.tables:
            raise ModelConfigError("model.module.tables: declare at least one table")
        names = table_names(self.tables)
        if len(set(names)) != len(names):
            raise ModelConfigError(f"model.module.tables: table names repeat: {names}")
        keys = [key for t in self.tables for key in t.feature_names]
        if len(set(keys)) != len(keys):
            raise ModelConfigError(
                f"model.module.tables: a feature is looked up in two tables: {keys}"
            )
        if self.collection_argument in self.kwargs:
            raise ModelConfigError(
                f"model.module.kwargs.{self.collection_argument}: streamrank passes the "
                "collection it builds from model.module.tables under that keyword"
            )

    @property
    def feature_names(self) -> list[str]:
        """Every KJT key, in table order."""
        return [key for t in self.tables for key in t.feature_names]

    def architecture(self) -> dict[str, Any]:
        """What two versions must share to swap live: factory, kwargs and tables (JSON-ready).

        Example::

            same = a.architecture() == b.architecture()
        """
        return {
            "factory": self.factory,
            "kwargs": json.loads(json.dumps(dict(self.kwargs), sort_keys=True, default=str)),
            "tables": [t.as_dict() for t in self.tables],
        }


def table_names(tables: Sequence[TableConfig]) -> list[str]:
    """The tables' names, in order."""
    return [t.name for t in tables]
