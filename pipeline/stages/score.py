"""Score: one forward and the top-K of every event, for one prepared batch at a time.

:class:`ForwardExecutor` runs them on one scoring thread, at most one batch in flight, so that
the loop can consume and prepare batch n+1 while batch n's forward runs (``overlap``). A caller
that waits for the result anyway (no overlap) has a CPU model score the batch on its own thread
instead: no hand-off and wake-up per batch. It hands the finished batch back to whoever asks
(:meth:`ForwardExecutor.take`): it never calls up into the loop or the processor.

Example::

    executor = ForwardExecutor(scorer, metrics)
    executor.start(prepared)
    finished = executor.take(wait=True)   # (prepared, scored) or raises what the forward raised
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from model.serving import Scorer
from model.serving.device import bind_thread
from pipeline.observability.metrics import Metrics
from pipeline.types import PreparedBatch, ScoredBatch

__all__ = ["ForwardExecutor", "score_batch"]


def score_batch(
    scorer: Scorer, prepared: PreparedBatch, pad_rows: int | None = None
) -> ScoredBatch:
    """Forward and top-K of one batch, in item ids (on the calling thread).

    Args:
        scorer: the served model.
        prepared: the batch and its model input.
        pad_rows: ranks of a sharded model pad every forward to the agreed row count.

    Returns:
        The best ``min(num_results, candidates)`` items of every event, best first.
    """
    events = prepared.batch.events
    probs = scorer.forward(prepared.staged.ready_input(), pad_rows, rows=events.num_rows)
    top = scorer.top_k(probs, events.candidate_counts, events.num_results)
    return ScoredBatch(
        counts=top.counts,
        item_ids=events.candidate_ids[top.row_index],
        scores=top.scores.astype("float64"),
        model_version=scorer.model_version,
        task_scores=top.tasks,
    )


class ForwardExecutor:
    """Runs :func:`score_batch` on one scoring thread, one batch at a time.

    The scoring thread binds the model's GPU first (:func:`model.serving.device.bind_thread`: a new
    thread's current device is ``cuda:0``) and warms the model up there (CUDA-graph trees are
    per thread) before the constructor returns, i.e. before the consumer joins the group.

    Args:
        scorer: the served model.
        metrics: the ``forward`` stage time.
        warm_up_rows: batch sizes to warm up at (:meth:`~model.serving.Scorer.warm_up`);
            collective with several ranks.

    Example::

        executor = ForwardExecutor(scorer, metrics, warm_up_rows=(4096, 2048))
        executor.start(prepared, pad_rows=None)
        prepared, scored = executor.take(wait=True)
    """

    def __init__(self, scorer: Scorer, metrics: Metrics, warm_up_rows: Sequence[int] = ()) -> None:
        self.scorer = scorer
        self._metrics = metrics
        self._pool = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="forward",
            initializer=bind_thread,
            initargs=(scorer.device,),
        )
        self._inflight: tuple[PreparedBatch | None, Future[ScoredBatch | None]] | None = None
        self._warm_up_rows = tuple(warm_up_rows)
        if warm_up_rows or scorer.graph_shapes:
            self._pool.submit(scorer.warm_up, self._warm_up_rows).result()

    @property
    def busy(self) -> bool:
        """Whether a batch has been started and not taken yet."""
        return self._inflight is not None

    def start(
        self, prepared: PreparedBatch | None, pad_rows: int | None = None, *, here: bool = False
    ) -> None:
        """Start a batch's forward (``None``: a collective forward with padding only).

        Args:
            prepared: the batch.
            pad_rows: the agreed row count of a collective forward.
            here: the caller waits for the result anyway: a model on the CPU that replays no
                CUDA graphs is scored on the calling thread (no hand-off to the scoring thread
                and back); :meth:`take` returns it all the same.

        Raises:
            RuntimeError: the previous batch was not taken yet.
        """
        if self._inflight is not None:
            raise RuntimeError("the previous batch's forward was not taken")
        scorer = self.scorer
        # No device to bind, no CUDA graphs recorded on the scoring thread: any thread may run it.
        if here and scorer.device.type == "cpu" and not scorer.graph_shapes:
            done: Future[ScoredBatch | None] = Future()
            try:
                done.set_result(self._score(prepared, pad_rows))
            except Exception as exc:
                done.set_exception(exc)
            self._inflight = (prepared, done)
            return
        self._inflight = (prepared, self._pool.submit(self._score, prepared, pad_rows))

    def take(self, wait: bool = True) -> tuple[PreparedBatch, ScoredBatch] | None:
        """The batch in flight with its result, once its forward is done.

        Args:
            wait: block until it is done; ``False`` returns ``None`` while it runs.

        Returns:
            ``(prepared, scored)``, or ``None`` when nothing (or only padding) was in flight.

        Raises:
            ForwardFailed: the forward or top-K raised; it carries the batch.
        """
        inflight = self._inflight
        if inflight is None or (not wait and not inflight[1].done()):
            return None
        self._inflight = None
        prepared, future = inflight
        try:
            scored = future.result()
        except Exception as exc:
            raise ForwardFailed(prepared, exc) from exc
        if prepared is None or scored is None:
            return None
        return prepared, scored

    def swap(self, scorer: Scorer) -> None:
        """Serve ``scorer`` from the next batch on (another model version), warmed up first on
        the scoring thread, like the first one (CUDA-graph trees are per thread).

        Call it between two batches: the batch in flight must have been taken.

        Args:
            scorer: the new model, on the same device.

        Raises:
            RuntimeError: a batch is in flight, or ``scorer`` is on another device.
            Exception: what the warm-up raised; the old scorer keeps serving then.
        """
        if self._inflight is not None:
            raise RuntimeError("cannot swap the model with a forward in flight")
        if scorer.device != self.scorer.device:
            raise RuntimeError(f"the new model is on {scorer.device}, not {self.scorer.device}")
        if self._warm_up_rows or scorer.graph_shapes:
            self._pool.submit(scorer.warm_up, self._warm_up_rows).result()
        self.scorer = scorer

    def shutdown(self) -> None:
        """Stop the scoring thread (after the forward in flight, if any, returns)."""
        self._pool.shutdown(wait=True)

    def _score(self, prepared: PreparedBatch | None, pad_rows: int | None) -> ScoredBatch | None:
        start = time.perf_counter()
        if prepared is None:
            assert pad_rows is not None
            self.scorer.forward_padding(pad_rows)
            return None
        scored = score_batch(self.scorer, prepared, pad_rows)
        scored.forward_s = time.perf_counter() - start
        self._metrics.observe_stage("forward", scored.forward_s)
        return scored


class ForwardFailed(Exception):
    """A batch's forward or top-K raised (``__cause__``); ``prepared`` is the batch (``None``
    for a padding forward)."""

    def __init__(self, prepared: PreparedBatch | None, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.prepared = prepared
        self.error = error
