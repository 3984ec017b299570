"""What to serve and how: the options one :class:`~model.serving.factory.ScorerFactory` builds.

Plain data, no torch import, so configuration code can build and check them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from model.distributed.config import SEQUENCE_SHARDING, ShardingConfig
from model.features.layout import InputLayout
from model.module.types import ModuleConfig
from model.options import CompileMode, Precision, QuantDtype

if TYPE_CHECKING:
    from model.module.store import CheckedVersion

__all__ = ["ServingOptions", "UnsupportedOption", "check_module_sharding"]


class UnsupportedOption(ValueError):
    """An option the chosen serving path cannot honour (e.g. quantized tables on several
    ranks). The CLI reports it in one line; nothing is silently dropped."""


@dataclass(frozen=True)
class ServingOptions:
    """How to serve a model.

    Attributes:
        checkpoint: the checkpoint directory (single-process or DCP).
        device: ``auto`` (``cuda:{local_rank}`` with a GPU, else ``cpu``), ``cpu`` or
            ``cuda:N``.
        quantize: embedding storage, ``fp32``/``fp16``/``int8``/``int4`` (one process only).
        compile: ``torch.compile`` the model (one process only).
        compile_mode: a :class:`~model.options.CompileMode`.
        precision: forward precision, ``fp32``/``tf32``/``bf16`` (every path).
        sharding: table placement when the job has several ranks.
        max_batch_rows: the usual largest batch (``batching.max_batch_rows``): the planner's
            batch size, and with graph shapes the largest padded batch.
        max_event_rows: the most rows one event can bring (``codec.max_candidates``): an event
            larger than ``max_batch_rows`` is a batch alone, so graph shapes must hold it too.
        module: a configured module (``[model.module]``) and its versions' weights;
            ``None``: the built-in ranker of the checkpoint's own spec.
        layout: the input the feature map builds for ``module`` (required with it).
        checked: ``checkpoint``'s version as its loader checked it against ``module``
            (:func:`model.module.store.check_version`); ``None``: checked when it is built.

    Example::

        options = ServingOptions(Path("artifacts/model"), precision=Precision.BF16)
        options.check(world_size=2)
    """

    checkpoint: Path
    device: str = "auto"
    quantize: QuantDtype = QuantDtype.FP32
    compile: bool = False
    compile_mode: CompileMode = CompileMode.DEFAULT
    precision: Precision = Precision.FP32
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    max_batch_rows: int = 4096
    max_event_rows: int = 1000
    module: ModuleConfig | None = None
    layout: InputLayout | None = None
    checked: CheckedVersion | None = None

    def __post_init__(self) -> None:
        if self.module is not None and self.layout is None:
            raise ValueError("a configured module needs the input layout of its feature map")

    @property
    def largest_batch_rows(self) -> int:
        """Rows of the largest batch served: ``max_batch_rows``, or one event alone when it
        brings more (``max_event_rows``): the largest graph shape, and the ingest workers'
        slots."""
        return max(self.max_batch_rows, self.max_event_rows)

    def check(self, world_size: int) -> None:
        """Refuse what a job of ``world_size`` ranks cannot serve.

        Raises:
            UnsupportedOption: naming the option and what to do instead.
        """
        if world_size <= 1:
            return
        if QuantDtype(self.quantize) is not QuantDtype.FP32:
            raise UnsupportedOption(
                f"model.quantize = {QuantDtype(self.quantize).value} serves in one process only "
                "(TorchRec shards quantized tables within one process, not across ranks): use "
                "--nproc 1, or model.quantize = fp32 with several ranks"
            )
        if self.compile:
            raise UnsupportedOption(
                "model.compile = true serves in one process only (a compiled "
                "DistributedModelParallel forward is not supported here): use --nproc 1, or "
                "model.compile = false with several ranks"
            )
        if self.module is not None:
            check_module_sharding(self.module, self.sharding)


def check_module_sharding(module: ModuleConfig, sharding: ShardingConfig) -> None:
    """Refuse a configured module that cannot be sharded as configured (several ranks).

    Raises:
        UnsupportedOption: managed collisions (one process only), or a sequence table with a
            sharding TorchRec's ``EmbeddingCollection`` sharder does not serve here.
    """
    if module.managed_collision is not None:
        raise UnsupportedOption(
            "model.module.managed_collision serves in one process only: TorchRec shards a "
            "managed-collision collection row-wise only (ManagedCollisionCollectionSharder), "
            "each rank remapping its own slice of the id range into its own rows, so the "
            "remappers' state of one process does not split over ranks (TorchRec 1.8 refuses "
            "to load it: 'Unexpected state_dict key type'); use --nproc 1"
        )
    for table in module.sequence_tables:
        kind = sharding.for_table(table).sharding_type
        if kind not in SEQUENCE_SHARDING:
            raise UnsupportedOption(
                f"model.sharding: sequence table {table.name} cannot be {kind.value}: "
                "TorchRec's EmbeddingCollection shards table_wise, column_wise or row_wise "
                "here (data_parallel fails in TorchRec 1.8 when the KJT holds other keys; "
                "the table-row/column kinds are not offered); pick one of those"
            )
