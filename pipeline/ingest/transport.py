"""How an ingest worker hands a batch to its rank's scoring server, and gets the scores back.

Each worker owns a few preallocated **slots** in shared memory (:class:`SharedSlot`: the model
input's dense matrix, KJT values and lengths, and the scores: one per row, or with a configured
output contract every column the output publishes), allocated once by the rank for the served
model's input layout and handed to the worker when it is spawned. Per batch the worker copies
its model input into the next slot (one ``memcpy`` per tensor, no pickling of arrays) and sends
a few integers through its pipe (:class:`ScoreRequest`); the server reads the slot in place
(zero copy on a CPU), runs the forward, writes the scores into the slot and answers with a
:class:`ScoreReply`. Two slots per worker let a worker build batch n+1 while batch n is scored
(``batching.overlap_forward``).

The pipe also carries the start (:class:`WorkerReady`, then :class:`StartConsuming` once every
worker of the rank is ready), the worker's metrics (:class:`MetricsReport`) and, last, its run
summary (:class:`WorkerDone`); :class:`WorkerLink` is the worker's end (thread safe).

Example::

    shape = SlotShape.for_spec(spec, max_rows=4096)  # or for_layout(scorer.layout, ...)
    slot = SharedSlot.allocate(shape)               # in the rank, before spawning
    request = slot.write(build_model_input(cols, spec), index=0)   # in the worker
    inp = slot.read(request, spec.feature_names)    # in the server: views, no copy
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch

from model.features.layout import InputLayout
from model.features.model_input import ModelInput, sparse_features
from model.features.spec import FeatureSpec
from model.module.types import OutputConfig
from pipeline.observability.latency_sketch import LatencySketch

__all__ = [
    "MetricsReport",
    "ScoreReply",
    "ScoreRequest",
    "ServerGone",
    "SharedSlot",
    "SlotShape",
    "StartConsuming",
    "WorkerDone",
    "WorkerLink",
    "WorkerReady",
]

SLOTS_PER_WORKER = 2
"""One batch being scored and the next one being built (``overlap_forward``)."""


@dataclass(frozen=True)
class SlotShape:
    """Capacity of one slot.

    Attributes:
        rows: rows of the largest batch (``ServingOptions.largest_batch_rows``: one event
            larger than a batch is a batch alone).
        values: KJT values of the largest batch (every key one value per row, plus the recent
            items, at most ``recent_items_cap`` per row).
        num_keys: sparse features.
        dense_dim: width of the dense matrix.
        score_columns: scores per row: 1 (the ranking score), or 1 + the task columns a
            configured output publishes (the ranking score first, as
            :meth:`~model.serving.Scorer.forward` returns them).
        weighted: the KJT carries a float32 weight per value (a configured layout's
            ``weighted``: an ``is_weighted`` collection reads them).
    """

    rows: int
    values: int
    num_keys: int
    dense_dim: int
    score_columns: int = 1
    weighted: bool = False

    @classmethod
    def for_spec(cls, spec: FeatureSpec, max_rows: int) -> SlotShape:
        """The slot that holds any batch of up to ``max_rows`` rows of ``spec``'s model.

        Example::

            SlotShape.for_spec(scorer.spec, max(4096, 1000))
        """
        keys = len(spec.feature_names)
        return cls(max_rows, max_rows * (keys + spec.recent_items_cap), keys, spec.dense_dim)

    @classmethod
    def for_layout(cls, layout: InputLayout, max_rows: int, score_columns: int = 1) -> SlotShape:
        """The slot that holds any batch of up to ``max_rows`` rows of a model with ``layout``
        (a configured module's: each key at most its ``ids_per_key`` ids per row).

        Example::

            SlotShape.for_layout(scorer.layout, 4096, score_columns=3)
        """
        per_row = sum(max(n, 1) for n in layout.ids_per_key)
        return cls(
            max_rows,
            max_rows * per_row,
            len(layout.keys),
            layout.dense_dim,
            score_columns,
            layout.weighted,
        )

    @classmethod
    def for_model(
        cls, inputs: FeatureSpec | InputLayout, output: OutputConfig, max_rows: int
    ) -> SlotShape:
        """The slot of a model: the built-in model's own (:meth:`for_spec`: one score per
        row), or a configured module's input layout with a score column per task column its
        output publishes (:meth:`for_layout`).

        Example::

            SlotShape.for_model(scorer.spec if scorer.builtin else scorer.layout,
                                scorer.output, 4096)
        """
        if isinstance(inputs, FeatureSpec):
            return cls.for_spec(inputs, max_rows)
        columns = 1 + len(output.task_columns) if output.task_columns else 1
        return cls.for_layout(inputs, max_rows, columns)

    @property
    def nbytes(self) -> int:
        """Shared memory one slot takes."""
        return (
            4 * self.rows * self.dense_dim
            + 8 * (self.values + self.num_keys * self.rows)
            + (4 * self.rows * self.score_columns)
            + (4 * self.values if self.weighted else 0)
        )


@dataclass(frozen=True)
class ScoreRequest:
    """Score the batch in slot ``slot`` (the worker's own slot number).

    Attributes:
        slot: which of the worker's slots.
        rows: rows of the batch.
        values: KJT values in the slot.
        length_per_key: values per sparse feature (in ``spec.feature_names`` order).
    """

    slot: int
    rows: int
    values: int
    length_per_key: tuple[int, ...]


@dataclass(frozen=True)
class ScoreReply:
    """The scores of a request are in its slot (``error``: what the forward raised instead).

    Attributes:
        slot: the request's slot.
        error: what the forward raised (``None``: scored).
        model_version: the version that scored it (a live swap changes it between two
            forwards; ``""``: not said).
    """

    slot: int
    error: BaseException | None = None
    model_version: str = ""


@dataclass(frozen=True)
class WorkerReady:
    """A worker is set up and waits for :class:`StartConsuming` before it joins the group."""


@dataclass(frozen=True)
class StartConsuming:
    """Every worker of the rank is ready: join the consumer group now (all together, so the
    group's first assignment already spreads the partitions over all of them)."""


@dataclass(frozen=True)
class MetricsReport:
    """A worker's metrics now (:func:`pipeline.ingest.relay.snapshot` of its registry)."""

    families: list[Any]


@dataclass(frozen=True)
class WorkerDone:
    """A worker's run is over: its summary (its last message).

    Attributes:
        summary: :meth:`pipeline.observability.summary.RunSummary.as_dict` of its run.
        latencies: its events' latencies (the run summary's sketch).
        first_input_at: ``time.monotonic()`` of its first input (``None``: none), comparable
            across the processes of a host.
        last_output_at: ``time.monotonic()`` of its last output.
        metrics: its final metrics (:class:`MetricsReport`'s families).
    """

    summary: dict[str, Any]
    latencies: LatencySketch
    first_input_at: float | None
    last_output_at: float | None
    metrics: list[Any]


class ServerGone(ConnectionError):
    """The scoring server closed the pipe (the rank is stopping or failed): not an event's fault
    (an ``OSError``, so poison isolation never bisects on it)."""


class SharedSlot:
    """One batch's model input and scores in shared memory, reachable from two processes.

    Args:
        shape: its capacity.
        dense: float32[rows, dense_dim]; values: int64[values]; lengths: int64[num_keys * rows];
        scores: float32[rows], or float32[rows, score_columns] with task columns; weights:
            float32[values] of a weighted shape, else empty: shared tensors (:meth:`allocate`
            makes them).
    """

    def __init__(
        self,
        shape: SlotShape,
        dense: torch.Tensor,
        values: torch.Tensor,
        lengths: torch.Tensor,
        scores: torch.Tensor,
        weights: torch.Tensor | None = None,
    ) -> None:
        self.shape = shape
        self.dense = dense
        self.values = values
        self.lengths = lengths
        self.scores = scores
        self.weights = torch.zeros(0, dtype=torch.float32) if weights is None else weights

    @classmethod
    def allocate(cls, shape: SlotShape) -> SharedSlot:
        """A new slot in shared memory (passed to a spawned worker as an argument).

        Example::

            slots = [SharedSlot.allocate(shape) for _ in range(SLOTS_PER_WORKER)]
        """
        return cls(
            shape,
            torch.zeros((shape.rows, shape.dense_dim), dtype=torch.float32).share_memory_(),
            torch.zeros(max(shape.values, 1), dtype=torch.int64).share_memory_(),
            torch.zeros(max(shape.num_keys * shape.rows, 1), dtype=torch.int64).share_memory_(),
            torch.zeros(_scores_shape(shape), dtype=torch.float32).share_memory_(),
            torch.zeros(
                max(shape.values, 1) if shape.weighted else 0, dtype=torch.float32
            ).share_memory_(),
        )

    def write(self, inp: ModelInput, index: int) -> ScoreRequest:
        """Copy ``inp`` (on the CPU) into this slot.

        Args:
            inp: the model input of a batch.
            index: this slot's number among the worker's slots (goes into the request).

        Returns:
            The request that names it.

        Raises:
            ValueError: the batch is larger than the slot (never for a batch the batcher
                closed: see :class:`SlotShape`).
        """
        rows, sparse = inp.num_rows, inp.sparse
        values, lengths = sparse.values(), sparse.lengths()
        n = values.numel()
        if rows > self.shape.rows or n > self.shape.values:
            raise ValueError(
                f"a batch of {rows} rows and {n} values does not fit an ingest slot "
                f"({self.shape.rows} rows, {self.shape.values} values)"
            )
        self.dense[:rows].copy_(inp.dense)
        self.values[:n].copy_(values)
        self.lengths[: lengths.numel()].copy_(lengths)
        if self.shape.weighted:  # a KJT without weights weighs each id 1.0
            weights = sparse.weights_or_none()
            if weights is None:
                self.weights[:n].fill_(1.0)
            else:
                self.weights[:n].copy_(weights)
        per_key = sparse.length_per_key()
        return ScoreRequest(index, rows, n, tuple(int(v) for v in per_key))

    def read(self, request: ScoreRequest, keys: Sequence[str]) -> ModelInput:
        """The request's model input: views of this slot (no copy).

        Args:
            request: what the worker sent.
            keys: the sparse features, in layout order (``spec.feature_names``).
        """
        rows = request.rows
        return ModelInput(
            dense=self.dense[:rows],
            sparse=sparse_features(
                keys,
                self.values[: request.values],
                self.lengths[: len(keys) * rows],
                rows,
                request.length_per_key,
                self.weights[: request.values] if self.shape.weighted else None,
            ),
        )

    def holds(self, inp: ModelInput) -> bool:
        """Whether ``inp`` is this slot's content (its dense matrix is this slot's memory)."""
        return inp.dense.data_ptr() == self.dense.data_ptr()


def _scores_shape(shape: SlotShape) -> tuple[int, ...]:
    """One score per row (the built-in layout), or a row of ``score_columns``."""
    rows = max(shape.rows, 1)
    return (rows,) if shape.score_columns == 1 else (rows, shape.score_columns)


class WorkerLink:
    """A worker's end of the pipe to the scoring server (thread safe).

    Args:
        conn: the worker's end of a duplex pipe.

    Example::

        link = WorkerLink(conn)
        reply = link.score(request)       # blocks until the server answers
        link.send(MetricsReport(families))
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()
        self._call_lock = threading.Lock()

    def score(self, request: ScoreRequest) -> ScoreReply:
        """Send a request and wait for its reply.

        Raises:
            ServerGone: the server closed the pipe.
        """
        with self._call_lock:
            self.send(request)
            try:
                reply = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise ServerGone("the rank's scoring server is gone") from exc
        if not isinstance(reply, ScoreReply) or reply.slot != request.slot:
            raise RuntimeError(f"unexpected reply {reply!r} to {request!r}")
        return reply

    def wait_for_start(self) -> None:
        """Say this worker is ready, and wait until the server says to start.

        Raises:
            ServerGone: the server closed the pipe.
        """
        with self._call_lock:
            self.send(WorkerReady())
            try:
                message = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise ServerGone("the rank's scoring server is gone") from exc
        if not isinstance(message, StartConsuming):
            raise RuntimeError(f"expected the start, got {message!r}")

    def send(self, message: object) -> None:
        """Send one message to the server.

        Raises:
            ServerGone: the server closed the pipe.
        """
        with self._send_lock:
            try:
                self._conn.send(message)
            except OSError as exc:
                raise ServerGone("the rank's scoring server is gone") from exc

    def close(self) -> None:
        """Close this end (the server reads end-of-file)."""
        self._conn.close()
