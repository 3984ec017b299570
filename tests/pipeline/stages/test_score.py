"""The score stage: forward and top-K of a batch, on the scoring thread, one in flight."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from model.serving import Scorer
from model.serving.graph_shapes import GraphShape
from pipeline.observability.metrics import Metrics
from pipeline.stages.score import ForwardExecutor, ForwardFailed, score_batch
from tests.pipeline.factories import columns, prepared_batch, tiny_scorer, user_event


class GatedScorer(Scorer):
    """A tiny scorer whose forward waits for :attr:`gate` (to observe the thread)."""

    def __init__(self) -> None:
        base = tiny_scorer()
        super().__init__(base.module, base.spec, base.model_version, base.device)
        self.gate = threading.Event()
        self.padding_rows: list[int] = []
        self.threads: set[str] = set()

    def forward(
        self, inp: object, pad_to: int | None = None, rows: int | None = None
    ) -> torch.Tensor:
        self.threads.add(threading.current_thread().name)
        assert self.gate.wait(10)
        return super().forward(inp, pad_to, rows)  # type: ignore[arg-type]

    def forward_padding(self, rows: int) -> None:
        self.padding_rows.append(rows)


def test_score_batch_gives_each_event_its_best_items_in_item_ids() -> None:
    scorer = tiny_scorer()
    prepared = prepared_batch([user_event(4, num_results=3), user_event(2)], scorer)
    scored = score_batch(scorer, prepared)
    assert scored.counts.tolist() == [3, 2]
    assert set(scored.item_ids[:3].tolist()) <= {100, 101, 102, 103}
    assert scored.model_version == scorer.model_version
    assert (scored.scores[:3][:-1] >= scored.scores[:3][1:]).all()  # best first


def test_the_forward_runs_on_the_scoring_thread_and_is_taken_once() -> None:
    scorer = GatedScorer()
    executor = ForwardExecutor(scorer, Metrics())
    prepared = prepared_batch([user_event(3)], scorer)
    executor.start(prepared)
    assert executor.busy and executor.take(wait=False) is None  # still running
    with pytest.raises(RuntimeError):
        executor.start(prepared)  # one batch in flight at most
    scorer.gate.set()
    done = executor.take(wait=True)
    assert done is not None and done[0] is prepared and done[1].counts.tolist() == [2]
    assert not executor.busy and executor.take(wait=True) is None
    assert scorer.threads and all(name.startswith("forward") for name in scorer.threads)
    executor.shutdown()


def test_a_padding_forward_gives_nothing_to_publish() -> None:
    scorer = GatedScorer()
    executor = ForwardExecutor(scorer, Metrics())
    executor.start(None, pad_rows=64)
    assert executor.take(wait=True) is None
    assert scorer.padding_rows == [64]
    executor.shutdown()


def test_a_failed_forward_is_raised_by_take_with_its_batch() -> None:
    scorer = tiny_scorer()
    executor = ForwardExecutor(scorer, Metrics())
    prepared = prepared_batch([user_event(3)], scorer)
    model_input = prepared.staged.model_input
    model_input.dense = model_input.dense[:, :1]  # wrong width: the forward fails
    executor.start(prepared)
    with pytest.raises(ForwardFailed) as failed:
        executor.take(wait=True)
    assert failed.value.prepared is prepared and isinstance(failed.value.error, RuntimeError)
    assert not executor.busy
    executor.shutdown()


def test_a_cpu_batch_the_caller_waits_for_is_scored_on_the_calling_thread() -> None:
    scorer = GatedScorer()
    scorer.gate.set()
    executor = ForwardExecutor(scorer, Metrics())
    prepared = prepared_batch([user_event(3)], scorer)
    executor.start(prepared, here=True)
    assert scorer.threads == {threading.current_thread().name}
    assert executor.busy
    done = executor.take(wait=False)  # already done: no wait
    assert done is not None and done[0] is prepared and done[1].counts.tolist() == [2]
    assert not executor.busy
    executor.shutdown()


def test_a_failure_on_the_calling_thread_is_raised_by_take_too() -> None:
    scorer = tiny_scorer()
    executor = ForwardExecutor(scorer, Metrics())
    prepared = prepared_batch([user_event(3)], scorer)
    prepared.staged.model_input.dense = prepared.staged.model_input.dense[:, :1]
    executor.start(prepared, here=True)
    with pytest.raises(ForwardFailed) as failed:
        executor.take(wait=True)
    assert failed.value.prepared is prepared and isinstance(failed.value.error, RuntimeError)
    executor.shutdown()


def test_cuda_graph_models_stay_on_the_scoring_thread() -> None:
    """A model replaying CUDA graphs recorded them on the scoring thread: ``here`` is ignored."""
    scorer = GatedScorer()
    scorer.gate.set()
    executor = ForwardExecutor(scorer, Metrics())
    prepared = prepared_batch([user_event(3)], scorer)
    scorer.graph_shapes = (GraphShape(rows=4, values_per_key=(4, 4, 4, 4, 4, 16)),)
    executor.start(prepared, here=True)
    assert executor.take(wait=True) is not None
    assert all(name.startswith("forward") for name in scorer.threads)
    executor.shutdown()


class WarmUpRecorder(Scorer):
    """A tiny scorer that records where it warms up, or fails to."""

    def __init__(self, version: str, fail: bool = False) -> None:
        base = tiny_scorer()
        super().__init__(base.module, base.spec, version, base.device)
        self.fail = fail
        self.warm_threads: list[str] = []

    def warm_up(self, batch_rows: object) -> float:
        self.warm_threads.append(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("warm-up failed")
        return 0.0


def test_a_swapped_scorer_is_warmed_up_on_the_scoring_thread_and_serves_next() -> None:
    first, second = WarmUpRecorder("v1"), WarmUpRecorder("v2")
    executor = ForwardExecutor(first, Metrics(), warm_up_rows=(8,))
    try:
        executor.start(prepared_batch([user_event()], first))
        with pytest.raises(RuntimeError, match="in flight"):
            executor.swap(second)  # never with a forward in flight
        assert executor.take(wait=True) is not None
        with pytest.raises(RuntimeError, match="warm-up failed"):
            executor.swap(WarmUpRecorder("broken", fail=True))
        assert executor.scorer is first  # a failed warm-up keeps the old model
        executor.swap(second)
        assert executor.scorer is second
        assert second.warm_threads == first.warm_threads  # the same scoring thread
        assert second.warm_threads[0].startswith("forward")
        executor.start(prepared_batch([user_event()], second))
        done = executor.take(wait=True)
        assert done is not None and done[1].model_version == "v2"
    finally:
        executor.shutdown()


class ThreadCountingScorer(Scorer):
    """A tiny scorer that records torch's intra-op thread count inside each forward."""

    def __init__(self) -> None:
        base = tiny_scorer()
        super().__init__(base.module, base.spec, base.model_version, base.device)
        self.torch_threads: list[int] = []

    def forward(
        self, inp: object, pad_to: int | None = None, rows: int | None = None
    ) -> torch.Tensor:
        self.torch_threads.append(torch.get_num_threads())
        return super().forward(inp, pad_to, rows)  # type: ignore[arg-type]


def test_a_retrieval_index_built_and_queried_leaves_the_forward_its_torch_threads() -> None:
    # The loop's thread builds the index at start-up and queries it per poll (retrieval.threads
    # = 1, the default), then scores batches itself (CPU, no overlap) or hands them to the
    # scoring thread: both forwards must run with torch's configured thread count.
    from model.retrieval.candidates import fill_candidates
    from model.retrieval.index import build_index, needed_tables
    from model.store.tables import EmbeddingTables
    from pipeline.settings.retrieval import RetrievalSettings

    config = RetrievalSettings().config  # the defaults: threads = 1
    scorer = ThreadCountingScorer()
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # not the machine's default, whatever its cores
    executor = ForwardExecutor(scorer, Metrics())
    try:
        tables = EmbeddingTables.from_ranker(scorer.module, needed_tables(config), "tiny-1")
        index = build_index(tables, np.arange(100, 400, dtype=np.int64), config)
        asking = columns([user_event(0), user_event(0, user_id=8)])
        assert fill_candidates(asking, index).candidate_counts.tolist() == [100, 100]
        prepared = prepared_batch([user_event(3)], scorer)
        executor.start(prepared, here=True)  # the loop's thread
        assert executor.take(wait=True) is not None
        executor.start(prepared)  # the scoring thread
        assert executor.take(wait=True) is not None
        assert scorer.torch_threads == [3, 3]
    finally:
        executor.shutdown()
        torch.set_num_threads(before)
