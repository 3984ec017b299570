"""The served model (TorchRec's ``PredictModule`` counterpart): forward and top-K of a batch.

A :class:`Scorer` is built by :class:`~model.serving.factory.ScorerFactory` (load, shard,
quantize, compile, warm up); it only runs batches. The same scorer serves one process and the
ranks of a sharded model (its module is then a ``DistributedModelParallel``: every rank calls
:meth:`Scorer.forward` together, padding to the agreed row count).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from model.features.build import FeatureColumns, build_model_input
from model.features.layout import InputLayout
from model.features.model_input import ModelInput, padding_input, warm_up_input
from model.features.spec import FeatureSpec
from model.module.output import DEFAULT_OUTPUT
from model.module.types import OutputConfig
from model.options import Precision
from model.serving.graph_shapes import GraphShape, pad_to_shape, shape_for
from model.serving.inference import score_probabilities
from model.serving.memory import embedding_bytes
from model.serving.topk import TopK, top_k_per_event
from model.serving.transfer import DeviceTransfer, StagedInput

__all__ = ["Scorer"]

log = logging.getLogger(__name__)


class Scorer:
    """Runs the ranker on batches.

    Args:
        module: the model: a :class:`~model.ranker.Ranker` or any configured module
            (:mod:`model.module`), maybe quantized or compiled, or a
            ``DistributedModelParallel``-wrapped one; ``forward(dense, sparse) -> Tensor``.
        inputs: the built-in ranker's feature spec, or a configured module's input layout.
        model_version: written into every Recommendation.
        device: where the forward runs (the module is already there).
        precision: forward precision (:mod:`model.serving.precision`).
        graph_shapes: for a model that replays CUDA graphs (:mod:`model.serving.graph_shapes`):
            every batch is padded to the smallest of these shapes before its forward; empty:
            batches keep their shapes.
        output: how the module's output ranks (logits or probabilities, which column).

    Example::

        scorer = ScorerFactory(options).create_scorer()
        probs = scorer.forward(scorer.stage(feature_columns).ready_input())
        top = scorer.top_k(probs, candidate_counts, num_results)
    """

    def __init__(
        self,
        module: nn.Module,
        inputs: FeatureSpec | InputLayout,
        model_version: str,
        device: torch.device,
        precision: Precision | str = Precision.FP32,
        graph_shapes: Sequence[GraphShape] = (),
        output: OutputConfig = DEFAULT_OUTPUT,
    ) -> None:
        self.module = module.eval()
        self._spec = inputs if isinstance(inputs, FeatureSpec) else None
        self.layout = inputs.input_layout() if isinstance(inputs, FeatureSpec) else inputs
        self.output = output
        self.model_version = model_version
        self.device = device
        self.precision = Precision(precision)
        self.graph_shapes = tuple(graph_shapes)
        self._transfer = DeviceTransfer(device) if device.type == "cuda" else None

    @property
    def builtin(self) -> bool:
        """Whether this is the built-in ranker (its features are :class:`FeatureColumns`)."""
        return self._spec is not None

    @property
    def spec(self) -> FeatureSpec:
        """The built-in ranker's feature spec.

        Raises:
            ValueError: the served model is a configured module (it has a :attr:`layout`).
        """
        if self._spec is None:
            raise ValueError(
                "the served model is a configured module ([model.module]): it has an input "
                "layout, not the built-in FeatureSpec"
            )
        return self._spec

    def stage(self, features: FeatureColumns) -> StagedInput:
        """Feature columns -> model input on its way to the model's device (on a GPU the copy
        runs asynchronously on a copy stream: :mod:`model.serving.transfer`)."""
        return self.stage_input(build_model_input(features, self.spec))

    def stage_input(self, inp: ModelInput) -> StagedInput:
        """A model input built on the host -> on its way to the model's device (padded to a
        graph shape first when the model replays CUDA graphs); :meth:`stage` without building.

        Args:
            inp: the batch on the CPU (e.g. read from an ingest worker's shared memory).

        Returns:
            The staged input (:meth:`StagedInput.ready_input` on the scoring thread).
        """
        if self.graph_shapes:  # padded on the host: the copy has the graph's static shapes
            inp = pad_to_shape(inp, shape_for(inp.num_rows, self.graph_shapes))
        if self._transfer is not None:
            return self._transfer.to_device(inp)
        return StagedInput(inp if self.device.type == "cpu" else inp.to(self.device))

    def forward(
        self, inp: ModelInput, pad_to: int | None = None, rows: int | None = None
    ) -> torch.Tensor:
        """Click probabilities of a batch on the model's device (one forward, no autograd).

        Args:
            inp: the batch (as :meth:`stage` made it).
            pad_to: ranks of a sharded model pad to the agreed row count (padding scores are
                dropped).
            rows: the batch's real rows when :meth:`stage` padded it to a graph shape (only
                they are returned); ``None``: all of ``inp``'s.

        Returns:
            float32[rows] probabilities; float32[rows, 1 + P] when the output config publishes
            task columns (the ranking score first: :meth:`top_k` takes either).
        """
        if self.graph_shapes:
            torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs are read
        probs = score_probabilities(self.module, inp, pad_to, self.precision, self.output)
        return probs if rows is None else probs[:rows]

    def forward_padding(self, rows: int) -> None:
        """Join a collective forward with padding only (this rank has no events)."""
        self.forward(padding_input(self.layout, rows, self.device))

    def top_k(
        self,
        probs: torch.Tensor,
        candidate_counts: npt.NDArray[np.int64],
        num_results: npt.NDArray[np.int64],
    ) -> TopK:
        """The best ``min(num_results, candidates)`` rows of every event (on the device; one
        synchronisation: :func:`model.serving.topk.top_k_per_event`); with published task
        columns (a 2-d :meth:`forward` result) their values for the kept rows too."""
        if probs.dim() == 2:
            return top_k_per_event(probs[:, 0], candidate_counts, num_results, probs[:, 1:])
        return top_k_per_event(probs, candidate_counts, num_results)

    def warm_up(self, batch_rows: Sequence[int]) -> float:
        """One forward and top-K per size (compiles, autotunes and initialises the device's
        libraries), after building one model input on the host (its layout kernel), so that no
        consumed partition waits on it. Collective with several ranks.

        Run it on the thread that will run the forwards (CUDA-graph trees are per thread). A
        model that replays CUDA graphs warms up every graph shape instead, three forwards each
        (eager warm-up, recording, one replay).

        Args:
            batch_rows: row counts; two different ones let ``torch.compile`` settle on
                dynamic shapes.

        Returns:
            Seconds it took.
        """
        start = time.perf_counter()
        if self._spec is not None:  # loads (or compiles) the built-in layout's kernel
            build_model_input(_one_event(self._spec), self._spec)
        sizes = [s.rows for s in self.graph_shapes for _ in range(3)] or list(batch_rows)
        for rows in sizes:
            inp = warm_up_input(self.layout, rows)
            if self.graph_shapes:
                inp = pad_to_shape(inp, shape_for(rows, self.graph_shapes))
            probs = self.forward(inp.to(self.device), rows=rows)
            counts = np.ones(rows, dtype=np.int64)
            self.top_k(probs, counts, counts)
        seconds = time.perf_counter() - start
        if batch_rows:
            log.info("warmed up on %s rows in %.1fs", list(batch_rows), seconds)
        return seconds

    def embedding_bytes(self) -> int:
        """Bytes of embedding tables held by this process (quantized or not; its shards)."""
        return embedding_bytes(self.module)


def _one_event(spec: FeatureSpec) -> FeatureColumns:
    """The columns of one event with one candidate and one recent item (all ids 0)."""
    one, zero = np.ones(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    return FeatureColumns(
        user_ids=zero,
        device_ids=zero,
        country_ids=zero,
        candidate_counts=one,
        candidate_ids=zero,
        recent_counts=one,
        recent_ids=zero,
        user_dense=np.zeros((1, spec.user_dense_dim), dtype=np.float32),
        item_category=zero,
        item_dense=np.zeros((1, spec.item_dense_dim), dtype=np.float32),
    )
