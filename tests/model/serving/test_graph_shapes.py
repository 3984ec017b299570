"""Tests for model.serving.graph_shapes: static shapes for CUDA-graph compile modes.

Recording and replaying real CUDA graphs needs a GPU; these tests check what makes one graph
per bucket possible (identical shapes for every batch of a bucket) and that padding does not
change the real rows' scores.
"""

from __future__ import annotations

import pytest
import torch

from model.features.build import FeatureColumns, build_model_input
from model.features.model_input import ModelInput, sparse_features
from model.features.spec import FeatureSpec
from model.options import CompileMode
from model.ranker import build_ranker
from model.serving.graph_shapes import (
    GraphShape,
    graph_shapes,
    max_ids_per_row,
    pad_to_shape,
    records_cuda_graphs,
    row_buckets,
    shape_for,
)
from model.serving.inference import score_probabilities

CUDA = torch.device("cuda", 0)


def test_row_buckets_halve_from_the_largest_batch() -> None:
    assert row_buckets(4096, count=4) == (512, 1024, 2048, 4096)
    assert row_buckets(4096) == (32, 64, 128, 256, 512, 1024, 2048, 4096)
    assert row_buckets(3000, count=3) == (750, 1500, 3000)
    assert row_buckets(5, count=8) == (1, 2, 3, 5)
    assert row_buckets(1) == (1,)
    assert row_buckets(100, count=1) == (100,)
    with pytest.raises(ValueError):
        row_buckets(0)
    with pytest.raises(ValueError):
        row_buckets(10, count=0)


@pytest.mark.parametrize("mode", list(CompileMode))
def test_only_compiled_graph_modes_on_cuda_record_graphs(mode: CompileMode) -> None:
    graphs = mode in (CompileMode.REDUCE_OVERHEAD, CompileMode.MAX_AUTOTUNE)
    assert records_cuda_graphs(True, mode, CUDA) is graphs
    assert records_cuda_graphs(True, mode.value, torch.device("cpu")) is False
    assert records_cuda_graphs(False, mode, CUDA) is False


def test_shapes_and_the_bucket_of_a_batch(spec: FeatureSpec) -> None:
    per_row = max_ids_per_row(spec)
    assert per_row == (1, 1, 1, 1, 1, spec.recent_items_cap)
    shapes = graph_shapes(spec, 64, count=3)
    assert [s.rows for s in shapes] == [16, 32, 64]
    assert shapes[0] == GraphShape(16, tuple(16 * n for n in per_row))
    assert shapes[0].padded_rows == 17
    assert shape_for(1, shapes).rows == 16
    assert shape_for(16, shapes).rows == 16
    assert shape_for(17, shapes).rows == 32
    assert shape_for(64, shapes).rows == 64
    with pytest.raises(ValueError, match="65 rows exceeds"):
        shape_for(65, shapes)


def _signature(inp: ModelInput) -> tuple[object, ...]:
    sparse = inp.sparse
    return (
        tuple(inp.dense.shape),
        tuple(sparse.values().shape),
        tuple(sparse.lengths().shape),
        tuple(sparse.length_per_key()),
        tuple(sparse.offset_per_key()),
        sparse.stride(),
    )


def test_every_batch_of_a_bucket_has_the_same_shapes(
    spec: FeatureSpec, cols: FeatureColumns
) -> None:
    shape = graph_shapes(spec, 128, count=2)[-1]
    batches = [
        build_model_input(cols.slice_events(a, b), spec) for a, b in ((0, 1), (1, 6), (6, 9))
    ]
    assert len({b.num_rows for b in batches}) == 3
    assert len({tuple(b.sparse.length_per_key()) for b in batches}) == 3
    padded = [pad_to_shape(b, shape) for b in batches]
    assert len({_signature(p) for p in padded}) == 1
    for p in padded:
        lengths = p.sparse.lengths().view(len(spec.feature_names), shape.padded_rows)
        assert lengths.sum(dim=1).tolist() == list(shape.values_per_key)  # a consistent KJT


def test_padding_keeps_the_real_rows_and_their_scores(
    spec: FeatureSpec, cols: FeatureColumns, single_thread: None
) -> None:
    ranker = build_ranker(spec, seed=2).eval()
    inp = build_model_input(cols.slice_events(0, 5), spec)
    shape = shape_for(inp.num_rows, graph_shapes(spec, 256))
    padded = pad_to_shape(inp, shape)
    rows = inp.num_rows
    assert torch.equal(padded.dense[:rows], inp.dense)
    assert not padded.dense[rows:].any()
    original, bags = inp.sparse.to_dict(), padded.sparse.to_dict()
    for key in spec.feature_names:
        assert torch.equal(bags[key].lengths()[:rows], original[key].lengths()), key
        assert torch.equal(
            bags[key].values()[: original[key].values().numel()], original[key].values()
        )
        assert not bags[key].lengths()[rows:-1].any(), key  # only the sink row holds padding
        assert not bags[key].values()[original[key].values().numel() :].any(), key  # id 0
    expected = score_probabilities(ranker, inp)
    got = score_probabilities(ranker, padded)[:rows]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_a_full_bucket_puts_the_missing_ids_in_the_sink_row(spec: FeatureSpec) -> None:
    keys, rows = spec.feature_names, 4
    shape = GraphShape(rows, tuple(rows * n for n in max_ids_per_row(spec)))
    recent = [0, 2, 1, 0]  # 3 of the 4 * cap recent ids the bucket can hold
    lengths = torch.tensor([1] * (5 * rows) + recent)
    inp = ModelInput(
        dense=torch.ones((rows, spec.dense_dim)),
        sparse=sparse_features(keys, torch.arange(5 * rows + 3), lengths, rows, [rows] * 5 + [3]),
    )
    padded = pad_to_shape(inp, shape)
    sink = padded.sparse.lengths().view(len(keys), rows + 1)[:, -1]
    assert sink.tolist() == [0] * 5 + [rows * spec.recent_items_cap - 3]


def test_a_batch_beyond_its_shape_is_refused(spec: FeatureSpec) -> None:
    keys, rows = spec.feature_names, 2
    too_many = spec.recent_items_cap * rows + 1
    lengths = torch.tensor([1] * (5 * rows) + [too_many, 0])
    inp = ModelInput(
        dense=torch.zeros((rows, spec.dense_dim)),
        sparse=sparse_features(
            keys, torch.zeros(5 * rows + too_many, dtype=torch.int64), lengths, rows
        ),
    )
    shape = GraphShape(rows, tuple(rows * n for n in max_ids_per_row(spec)))
    with pytest.raises(ValueError, match="exceed the graph shape"):
        pad_to_shape(inp, shape)
    with pytest.raises(ValueError, match="does not fit"):
        pad_to_shape(inp, GraphShape(1, shape.values_per_key))


def test_a_weighted_batch_pads_its_weights_with_the_ids(single_thread: None) -> None:
    from model.module.factory import build_module
    from tests.model.module.configs import WEIGHTED, WEIGHTED_LAYOUT

    module = build_module(WEIGHTED, seed=3).eval()
    weights = torch.tensor([0.5, 2.0, 1.5, 1.0, 3.0])
    inp = ModelInput(
        torch.randn(3, WEIGHTED_LAYOUT.dense_dim),
        sparse_features(
            list(WEIGHTED_LAYOUT.keys),
            torch.tensor([1, 2, 3, 4, 5]),
            torch.tensor([1, 1, 0, 2, 0, 1]),
            3,
            [2, 3],
            weights,
        ),
    )
    shape = shape_for(inp.num_rows, graph_shapes(WEIGHTED_LAYOUT, 16))
    padded = pad_to_shape(inp, shape)
    per_key = padded.sparse.to_dict()
    assert torch.equal(per_key["user"].weights()[:2], weights[:2])
    assert torch.equal(per_key["tags"].weights()[:3], weights[2:])
    assert not per_key["user"].weights()[2:].any()  # the sink row's ids weigh 0
    expected = score_probabilities(module, inp)
    got = score_probabilities(module, padded)[: inp.num_rows]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
