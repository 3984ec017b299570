"""``[model.module]``: the user's own ranker, built by an importable factory (absent: the built-in
DLRM). See :mod:`model.module` for the contract it meets.

Example::

    [model.module]
    factory = "torchrec.models.deepfm:SimpleDeepFMNN"
    output = "probabilities"
    [model.module.kwargs]
    num_dense_features = 3
    hidden_layer_size = 32
    deep_fm_dimension = 8
    [[model.module.tables]]
    name = "t_viewer"
    num_embeddings = 5000
    embedding_dim = 16
    features = ["viewer"]

A table is pooled (``kind = "bag"``, the default: the ``EmbeddingBagCollection`` passed under
``collection_argument``) or a sequence table (``kind = "sequence"``: the
``EmbeddingCollection`` passed under ``sequence_collection_argument``). ``weighted = true``
makes the pooled collection weighted; ``[model.module.managed_collision]`` puts an MCH remapper
in front of each pooled table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from model.module.types import (
    Activation,
    ManagedCollision,
    ModuleConfig,
    OutputConfig,
    TableConfig,
)
from pipeline.settings.section import Section

__all__ = ["ManagedCollisionSettings", "ModuleSettings", "TableSettings"]


class TableSettings(Section):
    """``[[model.module.tables]]``: one table of the collection streamrank builds."""

    name: str
    num_embeddings: int
    embedding_dim: int
    features: list[str]
    """The KJT keys that look it up (each one a ``[features.sparse.<key>]``)."""
    pooling: Literal["sum", "mean"] = "sum"
    """A pooled table's pooling (a sequence table does not pool)."""
    kind: Literal["bag", "sequence"] = "bag"
    """``bag``: pooled (the ``EmbeddingBagCollection``); ``sequence``: one vector per id (the
    ``EmbeddingCollection``, passed under ``sequence_collection_argument``)."""


class ManagedCollisionSettings(Section):
    """``[model.module.managed_collision]``: an MCH remapper in front of every pooled table
    (TorchRec's ``ManagedCollisionEmbeddingBagCollection``), as the model was trained."""

    input_hash_size: int
    """The raw ids' range: each pooled key's transform maps its ids into ``[0, input_hash_size)``
    (the remapper's input), not into the table's rows."""
    eviction_policy: Literal["lfu", "lru", "distance_lfu"] = "lfu"
    """The trained remappers' policy (its buffers are in the weights)."""
    eviction_interval: int = 1
    """As trained (nothing is evicted while serving)."""


class ModuleSettings(Section):
    """``[model.module]``: the factory, its keyword arguments, its tables and its output."""

    factory: str
    """``"package.module:function"`` (a class too), e.g.
    ``"torchrec.models.dlrm:DLRM_DCN"``."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the factory, besides the collection."""
    tables: list[TableSettings] = Field(default_factory=list)
    collection_argument: str = "embedding_bag_collection"
    """The keyword the ``EmbeddingBagCollection`` of the pooled ``tables`` is passed under."""
    sequence_collection_argument: str = ""
    """The keyword the ``EmbeddingCollection`` of the sequence ``tables`` is passed under
    (needed with a ``kind = "sequence"`` table)."""
    weighted: bool = False
    """The pooled collection is weighted (``is_weighted``): every id carries a weight, its
    key's ``weights`` field (1.0 for a key without one), summed (``pooling = "sum"``)."""
    managed_collision: ManagedCollisionSettings | None = None
    """An MCH remapper per pooled table (one process only: see docs/byom.md)."""
    device_argument: str = ""
    """A keyword the factory takes the dense layers' device under (``dense_device`` for
    TorchRec's DLRMs); empty: the module is moved after it is built."""
    output: Activation = Activation.LOGITS
    """``logits`` (scores are their sigmoid) or ``probabilities`` (used as they are)."""
    score_column: int = 0
    """The output column that ranks (a ``[rows, T]`` output)."""
    score_weights: list[float] = Field(default_factory=list)
    """Rank by this weighted sum of the ``T`` columns instead (after the sigmoid of logits)."""
    output_names: list[str] = Field(default_factory=list)
    """A name for each of the ``T`` output columns (e.g. ``["click", "purchase"]``): an output
    schema of your own (``[output]``) publishes a column's score under its name
    (``output.task_scores``); empty: the columns are unnamed."""
    state_dict_prefix: str = ""
    """Stripped from the keys of a state_dict file by ``streamrank model import``
    (``"model."`` for TorchRec's ``DLRMTrain``)."""
    code_dir: Path | None = None
    """A directory put first on the import path for the factory (your own code); unset:
    installed packages only. Never a model version directory."""

    _config: ModuleConfig = PrivateAttr()

    @model_validator(mode="after")
    def _valid(self) -> ModuleSettings:
        # ModelConfigError is a ValueError: one line naming the key
        self._config = self._module_config()
        return self

    @property
    def config(self) -> ModuleConfig:
        """The :class:`~model.module.types.ModuleConfig` these settings describe (made once, when
        the section was read): the start-up checks, the feature map and the sharding checks
        read it; the served config adds the feature map's ids per key
        (:func:`pipeline.models.preflight.configured_module`)."""
        return self._config

    def _module_config(self) -> ModuleConfig:
        tables = tuple(
            TableConfig(
                t.name,
                t.num_embeddings,
                t.embedding_dim,
                tuple(t.features),
                t.pooling,
                kind=t.kind,
            )
            for t in self.tables
        )
        mc = self.managed_collision
        managed = (
            None
            if mc is None
            else ManagedCollision(mc.input_hash_size, mc.eviction_policy, mc.eviction_interval)
        )
        return ModuleConfig(
            factory=self.factory,
            kwargs=self.kwargs,
            tables=tables,
            collection_argument=self.collection_argument,
            output=OutputConfig(
                self.output,
                self.score_column,
                tuple(self.score_weights),
                column_names=tuple(self.output_names),
            ),
            code_dir=str(self.code_dir) if self.code_dir else "",
            device_argument=self.device_argument,
            sequence_collection_argument=self.sequence_collection_argument,
            weighted=self.weighted,
            managed_collision=managed,
        )
