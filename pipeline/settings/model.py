"""The ``[model]`` section of the configuration: the model to serve, its placement and the
feature spec of new models.

The spec keys (``model.features.spec.SPEC_SETTING_KEYS``) take their defaults from
``FeatureSpec()``, and :meth:`ModelSettings.feature_spec` builds the spec from them
(``FeatureSpec.from_settings``): the spec is defined once, in :mod:`model.features.spec`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, PrivateAttr, model_validator

from model.distributed.config import (
    Balance,
    ShardingConfig,
    ShardingKind,
    TableShardingConfig,
)
from model.features.spec import SPEC_SETTING_KEYS, FeatureSpec
from model.options import CompileMode, Precision, QuantDtype
from pipeline.settings.module import ModuleSettings
from pipeline.settings.section import ConfigSection, Section, keys_of

if TYPE_CHECKING:
    _TableKeys = ConfigSection[TableShardingConfig]
else:
    _TableKeys = keys_of(TableShardingConfig)


class TableShardingSettings(_TableKeys):
    """``[model.sharding.tables.<feature or table name>]``: the sharding of one table, the keys
    of :class:`model.distributed.config.TableShardingConfig` (declared, documented and checked
    there; read as :attr:`config`)."""


class ShardingSettings(Section):
    """``[model.sharding]``: multi-rank table placement (see ``model.distributed``), read as
    :attr:`config` (a :class:`model.distributed.config.ShardingConfig`, made once).

    Example::

        [model.sharding]
        default = "table_wise"
        balance = "split"
        [model.sharding.tables.recent_items]
        sharding_type = "column_wise"
        ranks = [0, 1]
    """

    default: ShardingKind = ShardingKind.TABLE_WISE
    """Sharding of tables without an entry in ``tables`` (automatic kernel)."""
    balance: Balance = Balance.SPLIT
    """Who places table-wise tables without explicit ranks: ``split`` (bytes and lookup work
    balanced, big tables split over all ranks), ``bytes`` (whole tables, bytes balanced) or
    ``planner`` (TorchRec's planner)."""
    tables: dict[str, TableShardingSettings] = Field(default_factory=dict)
    """Per-table overrides keyed by feature name (``item_id``) or table name (``t_item_id``)."""

    _config: ShardingConfig = PrivateAttr()

    @model_validator(mode="after")
    def _valid(self) -> ShardingSettings:
        # raises ValueError on combinations the config rejects
        self._config = ShardingConfig(
            default=TableShardingConfig(self.default),
            per_table={name: table.config for name, table in self.tables.items()},
            balance=self.balance,
        )
        return self

    @property
    def config(self) -> ShardingConfig:
        """The :class:`model.distributed.config.ShardingConfig` these settings describe (made
        once, when the section was read): the serving options, ``plan`` and the benchmarks
        take it."""
        return self._config


_SPEC_DEFAULTS = FeatureSpec()


class ModelSettings(Section):
    """The model: its feature spec (used by ``init-model``), checkpoint and placement.

    The served model's spec is the one stored in its checkpoint; the spec fields here
    (``model.features.spec.SPEC_SETTING_KEYS``, defaults from ``FeatureSpec()``) only shape new
    models
    (``init-model``, ``bench model`` without a checkpoint).
    """

    checkpoint: Path = Path("artifacts/model")
    device: str = "auto"
    """``auto`` picks ``cuda:{local_rank}`` when a GPU is present, else ``cpu``."""
    num_threads: int = 0
    """torch intra-op threads; 0 keeps torch's default."""
    quantize: QuantDtype = QuantDtype.FP32
    """Embedding-table storage for serving in one process: ``fp32``, ``fp16`` or ``int8``
    (TorchRec quantized EmbeddingBagCollection)."""
    compile: bool = False
    """``torch.compile`` the served model. It compiles (warm-up forwards at the batch size)
    before the consumer joins the group, so no partition waits on a compile."""
    compile_mode: CompileMode = CompileMode.DEFAULT
    """``torch.compile`` mode, with ``compile = true``."""
    precision: Precision = Precision.FP32
    """Forward precision: ``fp32``, ``tf32`` (TF32 matmuls on GPUs) or ``bf16`` (autocast)."""
    sharding: ShardingSettings = Field(default_factory=ShardingSettings)
    """Multi-rank table placement (``[model.sharding]``)."""
    module: ModuleSettings | None = None
    """Your own ranker (``[model.module]``, with ``[features]``); unset: the built-in DLRM
    of the checkpoint's spec."""
    embedding_dim: int = _SPEC_DEFAULTS.embedding_dim
    num_embeddings: dict[str, int] = Field(
        default_factory=lambda: {t.feature.value: t.num_embeddings for t in _SPEC_DEFAULTS.tables}
    )
    """Rows per table, by sparse feature name (missing names keep their defaults)."""
    user_dense_dim: int = _SPEC_DEFAULTS.user_dense_dim
    item_dense_dim: int = _SPEC_DEFAULTS.item_dense_dim
    recent_items_cap: int = _SPEC_DEFAULTS.recent_items_cap
    dense_arch: list[int] = Field(default_factory=lambda: list(_SPEC_DEFAULTS.dense_arch))
    over_arch: list[int] = Field(default_factory=lambda: list(_SPEC_DEFAULTS.over_arch))

    def feature_spec(self) -> FeatureSpec:
        """The :class:`model.features.spec.FeatureSpec` these settings describe."""
        return FeatureSpec.from_settings(self.model_dump(include=set(SPEC_SETTING_KEYS)))
