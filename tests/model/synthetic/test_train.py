"""Tests for model.synthetic.train: batching and a tiny end-to-end training run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.features.build import FeatureColumns
from model.features.spec import FeatureSpec
from model.synthetic import SyntheticWorld
from model.synthetic.train import iter_row_batches, train_ranker


def test_iter_row_batches_covers_whole_events(cols: FeatureColumns) -> None:
    batches = list(iter_row_batches(cols, 50))
    assert batches[0][0] == 0 and batches[-1][1] == cols.num_events
    ends = np.concatenate([[0], np.cumsum(cols.candidate_counts)])
    for (e0, e1, r0, r1), nxt in zip(batches, [*batches[1:], None], strict=True):
        assert e1 > e0
        assert (r0, r1) == (ends[e0], ends[e1])
        assert r1 - r0 <= 50 or e1 - e0 == 1
        if nxt is not None:
            assert nxt[0] == e1
    with pytest.raises(ValueError):
        next(iter_row_batches(cols, 0))


@pytest.mark.slow
@pytest.mark.usefixtures("single_thread")
def test_tiny_training_learns(spec: FeatureSpec, world: SyntheticWorld) -> None:
    lines: list[str] = []
    result = train_ranker(
        spec,
        world,
        num_events=6_000,
        batch_rows=256,
        lr=3e-3,
        seed=0,
        log=lines.append,
        log_every=50,
    )
    assert result.auc > 0.65, result
    assert result.oracle_auc > result.auc - 0.02
    assert result.rows > 0 and result.holdout_rows > 0
    assert np.isfinite(result.train_loss) and np.isfinite(result.holdout_loss)
    assert any(line.startswith("holdout") for line in lines)
    assert not result.ranker.training
    bags = result.ranker.embedding_bag_collection.embedding_bags.values()
    assert all(isinstance(b, torch.nn.EmbeddingBag) and not b.sparse for b in bags)


def test_train_rejects_bad_arguments(spec: FeatureSpec, world: SyntheticWorld) -> None:
    with pytest.raises(ValueError, match="holdout_fraction"):
        train_ranker(spec, world, num_events=10, holdout_fraction=1.0)
    with pytest.raises(ValueError, match="epochs"):
        train_ranker(spec, world, num_events=10, epochs=0)
