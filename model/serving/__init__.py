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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from model.serving.factory import ScorerFactory
    from model.serving.options import ServingOptions, UnsupportedOption
    from model.serving.scorer import Scorer

_EXPORTS = {
    "ScorerFactory": "factory",
    "ServingOptions": "options",
    "UnsupportedOption": "options",
    "Scorer": "scorer",
}

__all__ = ["Scorer", "ScorerFactory", "ServingOptions", "UnsupportedOption"]


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first use (PEP 562): configuration code
    imports :mod:`model.serving.options` without torch."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
