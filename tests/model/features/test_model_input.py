"""ModelInput moves to any device at any time, with nothing left behind on the old one (a
weighted KJT's weights included)."""

from __future__ import annotations

import dataclasses

import torch

from model.features.build import FeatureColumns, build_model_input
from model.features.layout import InputLayout
from model.features.model_input import (
    ModelInput,
    pad_model_input,
    padding_input,
    sparse_features,
    warm_up_input,
)
from model.features.spec import FeatureSpec
from model.ranker import build_ranker


def _devices(tensors: list[torch.Tensor]) -> set[str]:
    return {t.device.type for t in tensors}


def test_moving_after_a_cpu_forward_leaves_no_cpu_tensor(
    cols: FeatureColumns, spec: FeatureSpec
) -> None:
    inp = build_model_input(cols, spec)
    build_ranker(spec, seed=0).score(inp)  # fills the KJT's per-key caches on the CPU
    moved = inp.to("meta")
    assert _devices(moved.tensors()) == {"meta"}
    assert moved.sparse.keys() == inp.sparse.keys()
    assert moved.sparse.length_per_key() == inp.sparse.length_per_key()


def test_the_per_key_split_needs_no_device_read(cols: FeatureColumns, spec: FeatureSpec) -> None:
    inp = build_model_input(cols, spec)
    lengths = inp.sparse.lengths().view(len(spec.feature_names), -1).sum(dim=1).tolist()
    assert inp.sparse.length_per_key_or_none() == lengths
    moved = inp.to("meta")  # a meta tensor cannot be read: the split must come from the host
    per_key = moved.sparse.to_dict()
    assert [per_key[k].values().shape[0] for k in spec.feature_names] == lengths


def test_padded_and_padding_inputs_move_too(cols: FeatureColumns, spec: FeatureSpec) -> None:
    inp = build_model_input(cols, spec)
    padded = pad_model_input(inp, inp.num_rows + 7)
    assert padded.sparse.length_per_key_or_none() == inp.sparse.length_per_key_or_none()
    assert _devices(padded.to("meta").tensors()) == {"meta"}
    empty = padding_input(spec, 5, "cpu")
    assert empty.sparse.length_per_key() == [0] * len(spec.feature_names)
    assert _devices(empty.to("meta").tensors()) == {"meta"}


def test_moved_input_scores_the_same(cols: FeatureColumns, spec: FeatureSpec) -> None:
    ranker = build_ranker(spec, seed=0)
    inp = build_model_input(cols, spec)
    first = ranker.score(inp)
    again = ranker.score(inp.to("cpu"))
    torch.testing.assert_close(first, again)


def test_weights_travel_with_the_ids_through_every_copy_and_padding() -> None:
    layout = InputLayout(("a", "b"), 2, (2, 1), weighted=True)
    weights = torch.tensor([0.5, 2.0, 1.0, 3.0])
    inp = ModelInput(
        torch.zeros(2, 2),
        sparse_features(
            ["a", "b"], torch.tensor([1, 2, 3, 4]), torch.tensor([2, 0, 1, 1]), 2, [2, 2], weights
        ),
    )
    for copy in (inp.to("meta"), pad_model_input(inp, 5)):
        assert copy.sparse.weights().shape == weights.shape
    assert torch.equal(pad_model_input(inp, 5).sparse.weights(), weights)
    assert _devices(inp.to("meta").tensors()) == {"meta"}
    assert padding_input(layout, 3, "cpu").sparse.weights().numel() == 0
    warm = warm_up_input(layout, 4)
    assert torch.equal(warm.sparse.weights(), torch.ones(12))
    unweighted = dataclasses.replace(layout, weighted=False)
    assert warm_up_input(unweighted, 4).sparse.weights_or_none() is None
