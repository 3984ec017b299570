"""The served module, described as plain data (no torch import: configuration code uses it).

A *module* is any ``torch.nn.Module`` with TorchRec's ranking forward::

    forward(dense_features: Tensor[R, D], sparse_features: KeyedJaggedTensor) -> Tensor

returning ``[R]``, ``[R, 1]`` or ``[R, T]``. It is built by an importable factory
(``"package.module:function"``) called with the keyword arguments of :attr:`ModuleConfig.kwargs`
and the collections streamrank builds from :attr:`ModuleConfig.tables`
(:mod:`model.module.factory`): the pooled tables' ``EmbeddingBagCollection`` under
:attr:`ModuleConfig.collection_argument` (weighted with :attr:`ModuleConfig.weighted`), the
sequence tables' ``EmbeddingCollection`` under :attr:`ModuleConfig.sequence_collection_argument`.

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
    "BAG",
    "EVICTION_POLICIES",
    "SEQUENCE",
    "Activation",
    "ManagedCollision",
    "ModelConfigError",
    "ModuleConfig",
    "OutputConfig",
    "TableConfig",
    "table_names",
]


BAG = "bag"
"""A pooled table (``EmbeddingBagCollection``): one vector per bag of ids, sum or mean."""
SEQUENCE = "sequence"
"""An unpooled table (``EmbeddingCollection``): one vector per id, the sequence kept."""


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
        pooling: ``sum`` or ``mean`` (pooled lookups: an ``EmbeddingBagCollection``); a
            sequence table keeps ``sum`` (it does not pool).
        ids_per_row: ids one scored row looks up in it at most (the planner's pooling factor;
            1 for a single-valued feature).
        module_path: where its collection sits inside the module (e.g.
            ``sparse_arch.embedding_bag_collection``; ``""`` until the module is built).
        kind: :data:`BAG` (pooled, the ``EmbeddingBagCollection``) or :data:`SEQUENCE`
            (unpooled, the ``EmbeddingCollection``: one vector per id of the bag).

    Example::

        TableConfig("t_item", 100_000, 64, ("item",))
        TableConfig("t_history", 100_000, 64, ("history",), kind=SEQUENCE)
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...]
    pooling: str = "sum"
    ids_per_row: int = 1
    module_path: str = ""
    kind: str = BAG

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
        if self.kind not in (BAG, SEQUENCE):
            raise ModelConfigError(f"table {self.name}: kind must be {BAG} or {SEQUENCE}")
        if self.kind == SEQUENCE and self.pooling != "sum":
            raise ModelConfigError(
                f"table {self.name}: a sequence table does not pool (drop pooling = "
                f"{self.pooling!r})"
            )
        object.__setattr__(self, "feature_names", tuple(self.feature_names))

    @property
    def sequence(self) -> bool:
        """Whether it is a sequence (unpooled) table."""
        return self.kind == SEQUENCE

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the architecture recorded with a module version; ``kind`` only for a
        sequence table, so a pooled table reads as it did before there were kinds)."""
        out: dict[str, Any] = {
            "name": self.name,
            "num_embeddings": self.num_embeddings,
            "embedding_dim": self.embedding_dim,
            "features": list(self.feature_names),
            "pooling": self.pooling,
        }
        if self.sequence:
            out["kind"] = self.kind
        return out


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


EVICTION_POLICIES = ("lfu", "lru", "distance_lfu")
"""TorchRec's MCH eviction policies (``LFU_EvictionPolicy``, ``LRU_EvictionPolicy``,
``DistanceLFU_EvictionPolicy``): each keeps its own buffers in the state_dict."""


@dataclass(frozen=True)
class ManagedCollision:
    """Managed collisions of the pooled tables: the ``EmbeddingBagCollection`` becomes a
    ``ManagedCollisionEmbeddingBagCollection``, one MCH remapper per table (TorchRec's
    ``MCHManagedCollisionModule``, ``zch_size`` = the table's rows) mapping raw ids in
    ``[0, input_hash_size)`` onto the table's rows; an id it does not hold looks up the last row.

    Served in eval mode: the remappers' state (their sorted raw ids and remapped rows) is part
    of the module's ``state_dict``, loaded with the version and swapped with it; nothing is
    evicted or learned while serving.

    Attributes:
        input_hash_size: the raw ids' range (the keys' transforms map into it).
        eviction_policy: one of :data:`EVICTION_POLICIES` (as trained: its buffers are in the
            weights).
        eviction_interval: as trained (unused while serving).

    Example::

        ManagedCollision(input_hash_size=1 << 20, eviction_policy="lfu")
    """

    input_hash_size: int
    eviction_policy: str = "lfu"
    eviction_interval: int = 1

    def __post_init__(self) -> None:
        if self.input_hash_size < 1:
            raise ModelConfigError("model.module.managed_collision.input_hash_size must be >= 1")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ModelConfigError(
                f"model.module.managed_collision.eviction_policy {self.eviction_policy!r}: "
                f"expected one of {', '.join(EVICTION_POLICIES)}"
            )
        if self.eviction_interval < 1:
            raise ModelConfigError("model.module.managed_collision.eviction_interval must be >= 1")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (part of the architecture)."""
        return {
            "input_hash_size": self.input_hash_size,
            "eviction_policy": self.eviction_policy,
            "eviction_interval": self.eviction_interval,
        }


@dataclass(frozen=True)
class ModuleConfig:
    """The module to serve: how to build it and how to read its output.

    Attributes:
        factory: ``"package.module:function"`` (any callable: a class too).
        kwargs: keyword arguments of the factory (TOML values).
        tables: the tables of the collections streamrank builds, in KJT key order.
        collection_argument: the keyword the pooled tables' ``EmbeddingBagCollection`` is
            passed under (not passed when every table is a sequence table).
        sequence_collection_argument: the keyword the sequence tables' ``EmbeddingCollection``
            is passed under; ``""``: the module takes none (no sequence table).
        weighted: the ``EmbeddingBagCollection`` is weighted (``is_weighted``): every id of a
            pooled key carries a weight (its ``weights`` field, else 1.0), summed.
        managed_collision: the pooled tables' remappers (``None``: none; see
            :class:`ManagedCollision`).
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
    sequence_collection_argument: str = ""
    weighted: bool = False
    managed_collision: ManagedCollision | None = None

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
        for argument in (self.collection_argument, self.sequence_collection_argument):
            if argument and argument in self.kwargs:
                raise ModelConfigError(
                    f"model.module.kwargs.{argument}: streamrank passes the collection it "
                    "builds from model.module.tables under that keyword"
                )
        self._check_collections()

    def _check_collections(self) -> None:
        """The pooled and the sequence collection as TorchRec can build them (one line)."""
        sequence = [t for t in self.tables if t.sequence]
        pooled = [t for t in self.tables if not t.sequence]
        if sequence and not self.sequence_collection_argument:
            raise ModelConfigError(
                f"model.module.tables: {sequence[0].name} is a sequence table: set "
                "model.module.sequence_collection_argument (the keyword its "
                "EmbeddingCollection is passed under)"
            )
        if sequence and self.sequence_collection_argument == self.collection_argument:
            raise ModelConfigError(
                "model.module.sequence_collection_argument: the same keyword as "
                "collection_argument; the two collections need a keyword each"
            )
        dims = sorted({t.embedding_dim for t in sequence})
        if len(dims) > 1:
            raise ModelConfigError(
                f"model.module.tables: the sequence tables have embedding_dim {dims}; "
                "TorchRec's EmbeddingCollection needs one for all of them"
            )
        if (self.weighted or self.managed_collision) and not pooled:
            what = "weighted" if self.weighted else "managed_collision"
            raise ModelConfigError(
                f"model.module.{what}: applies to the pooled tables, and every table is a "
                "sequence table"
            )
        mean = [t.name for t in pooled if t.pooling == "mean"]
        if self.weighted and mean:
            raise ModelConfigError(
                f"model.module.weighted: table {mean[0]} pools by mean; TorchRec's weighted "
                "EmbeddingBagCollection sums (torch's embedding_bag takes per_sample_weights "
                "with mode='sum' only): use pooling = 'sum'"
            )

    @property
    def pooled_tables(self) -> tuple[TableConfig, ...]:
        """The pooled tables (the ``EmbeddingBagCollection``), in order."""
        return tuple(t for t in self.tables if not t.sequence)

    @property
    def sequence_tables(self) -> tuple[TableConfig, ...]:
        """The sequence tables (the ``EmbeddingCollection``), in order."""
        return tuple(t for t in self.tables if t.sequence)

    @property
    def feature_names(self) -> list[str]:
        """Every KJT key, in table order."""
        return [key for t in self.tables for key in t.feature_names]

    def architecture(self) -> dict[str, Any]:
        """What two versions must share to swap live: factory, kwargs, tables and (when not
        the default: a plain ``EmbeddingBagCollection``) how the collections are built
        (JSON-ready).

        Example::

            same = a.architecture() == b.architecture()
        """
        out: dict[str, Any] = {
            "factory": self.factory,
            "kwargs": json.loads(json.dumps(dict(self.kwargs), sort_keys=True, default=str)),
            "tables": [t.as_dict() for t in self.tables],
        }
        collections: dict[str, Any] = {}
        if self.weighted:
            collections["weighted"] = True
        if self.managed_collision is not None:
            collections["managed_collision"] = self.managed_collision.as_dict()
        if collections:
            out["collections"] = collections
        return out


def table_names(tables: Sequence[TableConfig]) -> list[str]:
    """The tables' names, in order."""
    return [t.name for t in tables]
