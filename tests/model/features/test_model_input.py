"""ModelInput moves to any device at any time, with nothing left behind on the old one."""

from __future__ import annotations

import torch

from model.features.build import FeatureColumns, build_model_input
from model.features.model_input import pad_model_input, padding_input
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
