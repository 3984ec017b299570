"""The scorer an ingest worker's loop serves with: the model input is built here, the forward
runs in the rank's scoring server.

:class:`RemoteScorer` is a :class:`~model.serving.Scorer` to the loop
(:class:`~pipeline.runtime.loop.ScoringPipeline`, :mod:`pipeline.stages.score`,
:class:`~pipeline.runtime.processor.BatchProcessor`), which need no change:

- :meth:`RemoteScorer.stage` builds the model input on this worker's CPU (hashing, KJT layout)
  and copies it into the worker's next shared-memory slot (:mod:`pipeline.ingest.transport`);
- :meth:`RemoteScorer.forward` asks the server to score that slot and returns the scores it
  wrote there (one round trip through the pipe);
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
from model.features.model_input import ModelInput
from model.features.spec import FeatureSpec
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
        spec: the served model's feature spec.
        model_version: the served model's version (written into every Recommendation).

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
        spec: FeatureSpec,
        model_version: str,
    ) -> None:
        # Not Scorer.__init__: there is no module here; every method that would use one is
        # overridden below.
        self._spec = spec
        self.layout = spec.input_layout()
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
        return StagedInput(slot.read(request, self.spec.feature_names))

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
            float32 probabilities (a copy: the slot is reused two batches later).

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
