"""Building the served model (TorchRec's ``PredictFactory`` counterpart): one factory in front
of the single-process and the sharded path.

:meth:`ScorerFactory.create_scorer` checks the options against the job (an option a path cannot
honour is refused, never dropped), picks the device, loads the model through one strategy
(:mod:`model.serving.single` or :mod:`model.serving.sharded`), and applies the precision
(and, for a model that replays CUDA graphs, the static batch shapes:
:mod:`model.serving.graph_shapes`). The serving loop warms the scorer up on its scoring thread
(:meth:`~model.serving.scorer.Scorer.warm_up`) before the consumer joins the group, on both
paths.
"""

from __future__ import annotations

import logging

from model.rank import RankContext
from model.serving.device import serving_device
from model.serving.graph_shapes import GraphShape, graph_shapes, records_cuda_graphs
from model.serving.options import ServingOptions
from model.serving.scorer import Scorer
from model.serving.served import describe_served
from model.serving.single import load_single

__all__ = ["ScorerFactory"]

log = logging.getLogger(__name__)


class ScorerFactory:
    """Builds the :class:`~model.serving.scorer.Scorer` of this process.

    Args:
        options: what to serve and how.
        rank: this process's place in the job (several ranks: the model is sharded, and every
            rank must call :meth:`create_scorer` together).

    Example::

        scorer = ScorerFactory(ServingOptions(Path("artifacts/model"))).create_scorer()
        scorer = ScorerFactory(options, RankContext.from_env()).create_scorer()  # each rank
    """

    def __init__(self, options: ServingOptions, rank: RankContext | None = None) -> None:
        self.options = options
        self.rank = rank or RankContext()

    def create_scorer(self) -> Scorer:
        """Load, shard or quantize, and compile the model.

        Returns:
            The scorer (not warmed up: see :meth:`~model.serving.scorer.Scorer.warm_up`).

        Raises:
            UnsupportedOption: an option this job cannot serve (e.g. quantized tables on
                several ranks).
            ValueError: a device that does not exist here, or a checkpoint that does not fit.
            FileNotFoundError: no checkpoint at ``options.checkpoint``.
        """
        options, rank = self.options, self.rank
        options.check(rank.world_size)
        device = serving_device(options.device, rank.local_rank)
        served = describe_served(options)
        if rank.distributed:
            # Imported here: the single-process path never imports torchrec.distributed.
            from model.serving.sharded import load_sharded_model

            module = load_sharded_model(options, served, device, rank)
        else:
            module = load_single(options, served, device)
        shapes: tuple[GraphShape, ...] = ()
        if records_cuda_graphs(options.compile, options.compile_mode, device):
            shapes = graph_shapes(served.layout, options.largest_batch_rows)
        return Scorer(
            module,
            served.spec or served.layout,
            served.model_version,
            device,
            options.precision,
            shapes,
            output=served.config.output,
        )
