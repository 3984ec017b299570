"""The forward executor: batch order, overlap, padding, errors."""

from __future__ import annotations

import threading

import pytest
import torch

from pipeline.metrics import Metrics
from pipeline.stages.score import ForwardExecutor, PreparedBatch, ScoredBatch, Scorer
from tests.pipeline.factories import prepared_batch, tiny_scorer, user_event


class GatedScorer(Scorer):
    """A tiny scorer whose forward waits for :attr:`gate` (to observe overlap)."""

    def __init__(self) -> None:
        base = tiny_scorer()
        super().__init__(base.ranker, base.spec, base.model_version, base.device)
        self.gate = threading.Event()
        self.padding_rows: list[int] = []

    def forward(self, inp: object, pad_to: int | None = None) -> torch.Tensor:
        assert self.gate.wait(10)
        return super().forward(inp, pad_to)  # type: ignore[arg-type]

    def forward_padding(self, rows: int) -> None:
        self.padding_rows.append(rows)


def _executor(
    scorer: Scorer, overlap: bool, collective: bool = False
) -> tuple[ForwardExecutor, list[tuple[PreparedBatch, ScoredBatch]]]:
    published: list[tuple[PreparedBatch, ScoredBatch]] = []
    executor = ForwardExecutor(
        scorer, Metrics(), lambda b, s: published.append((b, s)), overlap, collective
    )
    return executor, published


def test_without_overlap_submit_publishes_before_returning() -> None:
    scorer = tiny_scorer()
    executor, published = _executor(scorer, overlap=False)
    batch = prepared_batch([user_event(4, num_results=3), user_event(2)], scorer)
    executor.submit(batch)
    assert len(published) == 1
    (got, scored) = published[0]
    assert got is batch
    assert scored.counts.tolist() == [3, 2]
    assert set(scored.item_ids[:3].tolist()) <= {100, 101, 102, 103}
    executor.shutdown()


def test_with_overlap_one_forward_in_flight_and_batches_published_in_order() -> None:
    scorer = GatedScorer()
    executor, published = _executor(scorer, overlap=True)
    first = prepared_batch([user_event(3)], scorer)
    second = prepared_batch([user_event(2)], scorer)
    executor.submit(first)
    executor.finish(wait=False)
    assert published == []  # still running
    scorer.gate.set()
    executor.submit(second)  # publishes the first before starting the second
    assert [b for b, _ in published] == [first]
    executor.finish()
    assert [b for b, _ in published] == [first, second]
    executor.shutdown()


def test_padding_only_forward_publishes_nothing() -> None:
    scorer = GatedScorer()
    executor, published = _executor(scorer, overlap=False, collective=True)
    executor.submit_padding(64)
    executor.finish()
    assert scorer.padding_rows == [64]
    assert published == []
    executor.shutdown()


def test_a_failed_forward_raises_in_finish() -> None:
    scorer = tiny_scorer()
    executor, published = _executor(scorer, overlap=True)
    batch = prepared_batch([user_event(3)], scorer)
    batch.staged.model_input.dense = batch.staged.model_input.dense[
        :, :1
    ]  # wrong width: the forward fails
    executor.submit(batch)
    with pytest.raises(RuntimeError):
        executor.finish()
    assert published == []
    executor.shutdown()
