"""Forward precision: fp32 is the reference, tf32 changes nothing on a CPU, bf16 stays close."""

from __future__ import annotations

import pytest
import torch

from model.features.build import FeatureColumns, build_model_input
from model.features.spec import FeatureSpec
from model.options import Precision
from model.ranker import build_ranker
from model.serving.inference import score_probabilities
from model.serving.precision import precision_scope


@pytest.fixture
def scores(cols: FeatureColumns, spec: FeatureSpec) -> dict[Precision, torch.Tensor]:
    ranker = build_ranker(spec, seed=0)
    inp = build_model_input(cols, spec)
    return {p: score_probabilities(ranker, inp, precision=p) for p in Precision}


def test_every_precision_returns_float32_probabilities(
    scores: dict[Precision, torch.Tensor],
) -> None:
    for probs in scores.values():
        assert probs.dtype == torch.float32
        assert bool(((probs >= 0) & (probs <= 1)).all())


def test_tf32_on_a_cpu_is_exactly_fp32(scores: dict[Precision, torch.Tensor]) -> None:
    torch.testing.assert_close(scores[Precision.TF32], scores[Precision.FP32], rtol=0, atol=0)


def test_bf16_autocast_changes_scores_a_little(scores: dict[Precision, torch.Tensor]) -> None:
    diff = (scores[Precision.BF16] - scores[Precision.FP32]).abs().max().item()
    assert 0 < diff < 2e-2


def test_tf32_scope_restores_the_global_flags() -> None:
    before = torch.backends.cuda.matmul.allow_tf32
    with precision_scope("tf32", torch.device("cuda", 0)):
        assert torch.backends.cuda.matmul.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32 == before


def test_unknown_precision_is_rejected() -> None:
    with pytest.raises(ValueError), precision_scope("fp8", torch.device("cpu")):
        pass
