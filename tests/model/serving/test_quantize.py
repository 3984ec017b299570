"""Tests for model.quantize (and model.compile's switch): table sizes and score deviations.

Quantized rows are padded to 16 bytes, so the int8 ratio is ~0.3x only for realistic widths:
these tests use embedding_dim 64 (int8 row: 64 + 4 bytes scale/bias -> 80 bytes vs 256).
"""

from __future__ import annotations

import pytest
import torch
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from model.features.build import FeatureColumns, build_model_input
from model.features.model_input import ModelInput, pad_model_input
from model.features.spec import FeatureSpec
from model.ranker import Ranker, build_ranker
from model.serving.compile import maybe_compile
from model.serving.memory import embedding_bytes
from model.serving.quantize import (
    QuantDtype,
    compare_quantized,
    quantize_ranker,
    quantize_with_report,
)
from tests.model.conftest import small_spec


@pytest.fixture(scope="module")
def spec64() -> FeatureSpec:
    return small_spec(embedding_dim=64, dense_arch=(64, 64), over_arch=(64, 1))


@pytest.fixture(scope="module")
def ranker(spec64: FeatureSpec) -> Ranker:
    return build_ranker(spec64, seed=9).eval()


@pytest.fixture(scope="module")
def inp(cols: FeatureColumns, spec64: FeatureSpec) -> ModelInput:
    return build_model_input(cols, spec64)


def _rows(spec: FeatureSpec) -> int:
    return sum(t.num_embeddings for t in spec.tables)


def test_fp32_bytes_are_rows_times_dim(ranker: Ranker, spec64: FeatureSpec) -> None:
    assert embedding_bytes(ranker) == _rows(spec64) * 64 * 4


def test_int8_is_about_a_third_and_close(
    ranker: Ranker, inp: ModelInput, spec64: FeatureSpec
) -> None:
    before = {k: v.clone() for k, v in ranker.state_dict().items()}
    q, report = quantize_with_report(ranker, "int8", inp)
    assert report.dtype is QuantDtype.INT8
    # Rows: 64 int8 + fp16 scale and bias, padded to 80 bytes; each table's block is aligned.
    assert 0 <= report.quant_bytes - _rows(spec64) * 80 <= 256 * len(spec64.tables)
    assert 0.25 <= report.ratio <= 0.35
    assert report.max_abs_score_diff < 1e-3
    assert report.num_rows == inp.num_rows
    # The original is untouched (still float tables, same weights).
    assert isinstance(ranker.model.sparse_arch.embedding_bag_collection, EmbeddingBagCollection)
    assert all(torch.equal(before[k], v) for k, v in ranker.state_dict().items())
    assert not isinstance(q.model.sparse_arch.embedding_bag_collection, EmbeddingBagCollection)
    assert not q.training


def test_fp16_halves_and_is_closer(ranker: Ranker, inp: ModelInput) -> None:
    q = quantize_ranker(ranker, QuantDtype.FP16)
    report = compare_quantized(ranker, q, inp, "fp16")
    assert report.ratio == pytest.approx(0.5)
    assert report.max_abs_score_diff < 1e-4


def test_fp32_is_an_identical_copy(ranker: Ranker, inp: ModelInput) -> None:
    q = quantize_ranker(ranker, "fp32")
    assert q is not ranker
    assert torch.equal(q.score(inp), ranker.score(inp))
    assert embedding_bytes(q) == embedding_bytes(ranker)


def test_quantized_runs_padded_batches_and_inference_mode(ranker: Ranker, inp: ModelInput) -> None:
    q = quantize_ranker(ranker, "int8")
    padded = pad_model_input(inp, inp.num_rows + 7)
    scores = q.score(padded)
    assert scores.shape == (inp.num_rows + 7,)
    assert torch.allclose(scores[: inp.num_rows], q.score(inp), atol=1e-6)
    with torch.inference_mode():
        logits = q(inp.dense, inp.sparse)
    assert torch.allclose(torch.sigmoid(logits), q.score(inp), atol=1e-6)


def test_int4_is_smaller_still(ranker: Ranker, inp: ModelInput) -> None:
    _, report = quantize_with_report(ranker, "int4", inp)
    assert report.ratio < 0.25
    assert report.max_abs_score_diff < 1e-2


def test_errors(spec64: FeatureSpec) -> None:
    with pytest.raises(ValueError):
        quantize_ranker(build_ranker(spec64, seed=0), "int3")
    with pytest.raises(ValueError, match="meta"):
        quantize_ranker(build_ranker(spec64, embedding_device="meta"), "int8")


def test_maybe_compile_disabled_is_a_no_op(ranker: Ranker, inp: ModelInput) -> None:
    assert maybe_compile(ranker, False) is ranker
    assert torch.equal(ranker.score(inp), ranker.score(inp))
