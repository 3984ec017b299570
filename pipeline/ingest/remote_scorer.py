"""The scorer an ingest worker's loop serves with: the model input is built here, the forward
runs in the rank's scoring server.

:class:`RemoteScorer` is a :class:`~model.serving.Scorer` to the loop
(:class:`~pipeline.runtime.loop.ScoringPipeline`, :mod:`pipeline.stages.score`,
:class:`~pipeline.runtime.processor.BatchProcessor`), which need no change:

- :meth:`RemoteScorer.stage` builds the built-in model's input on this worker's CPU (hashing,
  KJT layout) and copies it into the worker's next shared-memory slot
  (:mod:`pipeline.ingest.transport`); a configured model's input, built by the loop's features
  stage (:class:`~pipeline.stages.features.MappedFeatures`), goes in through
  :meth:`RemoteScorer.stage_input` the same way;
- :meth:`RemoteScorer.forward` asks the server to score that slot and returns the scores it
  wrote there (one round trip through the pipe): the ranking score, and the task columns a
  configured output publishes; the reply names the version that scored them (the server may
  have swapped one in), which the loop writes into the batch's records;
- :meth:`~model.serving.Scorer.top_k` runs here, on the CPU, as the loop calls it.

A forward that raised in the server is raised again here, as the same exception when it could be
pickled, so a poison event is bisected and dead-lettered by this worker's loop exactly as in a
single process. The pipe closing raises :class:`~pipeline.ingest.transport.ServerGone`, which is
no event's fault: the worker stops uncommitted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from model.features.build import FeatureColumns, build_model_input
from model.features.layout import InputLayout
from model.features.model_input import ModelInput
from model.features.spec import FeatureSpec
from model.module.output import DEFAULT_OUTPUT
from model.module.types import OutputConfig
from model.options import Precision
from model.serving import Scorer
from model.serving.transfer import StagedInput
from pipeline.ingest.transport import ScoreRequest, SharedSlot, WorkerLink

__all__ = ["RemoteScorer"]


class RemoteScorer(Scorer):
    """Builds model inputs in shared memory; the rank's server runs the forwards.

    Args:
        link: this worker's pipe to the server.
        slots: this worker's shared-memory slots (numbered by position, as the server knows
            them).
        inputs: the built-in model's feature spec, or a configured module's input layout.
        model_version: the served model's version at the start (each reply says the version
            that scored the batch).
        output: the served model's output config (its published task columns come back with
            the ranking score).

    Example::

        scorer = RemoteScorer(WorkerLink(conn), slots, spec, "dlrm-1")
        staged = scorer.stage(columns)                      # slot 0
        probs = scorer.forward(staged.ready_input())        # scored by the server
        top = scorer.top_k(probs, counts, num_results)      # here
    """

    def __init__(
        self,
        link: WorkerLink,
        slots: Sequence[SharedSlot],
        inputs: FeatureSpec | InputLayout,
        model_version: str,
        output: OutputConfig = DEFAULT_OUTPUT,
    ) -> None:
        # Not Scorer.__init__: there is no module here; every method that would use one is
        # overridden below.
        self._spec = inputs if isinstance(inputs, FeatureSpec) else None
        self.layout = inputs.input_layout() if isinstance(inputs, FeatureSpec) else inputs
        self.output = output
        self.model_version = model_version
        self.device = torch.device("cpu")
        self.precision = Precision.FP32
        self.graph_shapes = ()
        self._link = link
        self._slots = list(slots)
        self._next = 0
        self._requests: dict[int, ScoreRequest] = {}

    def stage(self, features: FeatureColumns) -> StagedInput:
        """Build the batch's model input into the next shared-memory slot.

        Args:
            features: the batch's feature columns.

        Returns:
            The input, as views of the slot (:meth:`forward` sends the slot).
        """
        return self.stage_input(build_model_input(features, self.spec))

    def stage_input(self, inp: ModelInput) -> StagedInput:
        """Copy a model input built on the host into the next slot.

        Args:
            inp: the batch, on the CPU.

        Returns:
            The input, as views of the slot.
        """
        index = self._next
        self._next = (index + 1) % len(self._slots)
        slot = self._slots[index]
        request = slot.write(inp, index)
        self._requests[index] = request
        return StagedInput(slot.read(request, self.layout.keys))

    def forward(
        self, inp: ModelInput, pad_to: int | None = None, rows: int | None = None
    ) -> torch.Tensor:
        """Have the server score ``inp`` (a slot's content, else it is copied into one first).

        Args:
            inp: the batch.
            pad_to: must be ``None``: a worker never takes part in a collective forward (its
                server does).
            rows: the real rows (``None``: all of ``inp``'s).

        Returns:
            float32[rows] probabilities, or float32[rows, 1 + P] with published task columns
            (a copy: the slot is reused two batches later). :attr:`model_version` is the
            version that scored them from now on.

        Raises:
            Exception: what the forward raised in the server.
            ServerGone: the server closed the pipe.
        """
        if pad_to is not None:
            raise ValueError("an ingest worker's forward is never collective")
        request = self._request_for(inp)
        if request is None:  # not built by stage(): copy it into a slot first
            request = self._request_for(self.stage_input(inp).model_input)
            assert request is not None
        reply = self._link.score(request)
        if reply.error is not None:
            raise reply.error
        if reply.model_version:
            self.model_version = reply.model_version
        probs = self._slots[request.slot].scores[: request.rows].clone()
        return probs if rows is None else probs[:rows]

    def _request_for(self, inp: ModelInput) -> ScoreRequest | None:
        """The request of the slot that holds ``inp`` (``None``: no slot does)."""
        for index, slot in enumerate(self._slots):
            request = self._requests.get(index)
            if slot.holds(inp) and request is not None and request.rows == inp.num_rows:
                return request
        return None

    def forward_padding(self, rows: int) -> None:
        """Never called: a worker's loop is not collective (its server joins the ranks' steps).

        Raises:
            RuntimeError: always.
        """
        raise RuntimeError("an ingest worker never joins a collective forward")

    def warm_up(self, batch_rows: Sequence[int]) -> float:
        """Nothing to do: the server warmed the model up before it started the workers.

        Returns:
            0.0 seconds.
        """
        return 0.0

    def embedding_bytes(self) -> int:
        """0: the embedding tables live in the rank's process (its metrics report them)."""
        return 0
