"""Serving the ranker: build it once (:class:`ScorerFactory`), then run batches
(:class:`Scorer`), as TorchRec splits ``PredictFactory`` from ``PredictModule``.

=================  ==================================================================
module             job
=================  ==================================================================
``options``        :class:`ServingOptions`: what to serve and how; what a job refuses
``factory``        :class:`ScorerFactory`: device, load, shard/quantize, compile, warm-up
``single``         strategy: one process (quantized and compiled models too)
``sharded``        strategy: ``DistributedModelParallel`` across the job's ranks
``scorer``         :class:`Scorer`: model input to the device, forward, top-K
=================  ==================================================================

Only torch, TorchRec and ``model.*`` are imported (the GPU check runs without the pipeline's
dependencies); the sharded strategy imports ``torchrec.distributed`` only when it is used.

Example::

    from model.serving import ScorerFactory, ServingOptions

    options = ServingOptions(Path("artifacts/model"), precision=Precision.BF16)
    scorer = ScorerFactory(options).create_scorer()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from model.lazy import lazy_exports

if TYPE_CHECKING:
    from model.serving.factory import ScorerFactory
    from model.serving.options import ServingOptions, UnsupportedOption
    from model.serving.scorer import Scorer

EXPORTS: dict[str, tuple[str, ...]] = {
    "factory": ("ScorerFactory",),
    "options": ("ServingOptions", "UnsupportedOption"),
    "scorer": ("Scorer",),
}
"""For each submodule, the names the package re-exports from it."""

__all__, __getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
