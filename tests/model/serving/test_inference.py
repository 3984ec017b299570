"""Tests for model.serving.inference: the one scoring forward."""

from __future__ import annotations

import torch

from model.features.build import FeatureColumns, build_model_input
from model.features.model_input import pad_model_input
from model.features.spec import FeatureSpec
from model.ranker import build_ranker
from model.serving.inference import score_probabilities


def test_probabilities_padding_and_no_autograd(cols: FeatureColumns, spec: FeatureSpec) -> None:
    ranker = build_ranker(spec, seed=0).eval()
    inp = build_model_input(cols, spec)
    probs = score_probabilities(ranker, inp)
    assert probs.shape == (inp.num_rows,) and not probs.requires_grad
    assert ((probs >= 0) & (probs <= 1)).all()
    with torch.no_grad():
        expected = torch.sigmoid(ranker(inp.dense, inp.sparse))
    assert torch.equal(probs, expected)
    padded = score_probabilities(ranker, inp, pad_to=inp.num_rows + 17)
    assert torch.allclose(padded, probs, atol=1e-6)
    assert torch.equal(score_probabilities(ranker, inp, pad_to=1), probs)
    assert torch.equal(ranker.score(inp), probs)
    empty = score_probabilities(
        ranker, pad_model_input(build_model_input(cols.slice_events(0, 0), spec), 3)
    )
    assert empty.shape == (3,)
