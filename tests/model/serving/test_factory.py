"""The model factory: options -> served model (precision, warm-up before joining, refusals)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model.checkpoint import save_checkpoint
from model.options import Precision
from model.quant_dtype import QuantDtype
from model.rank import RankContext
from model.ranker import build_ranker
from model.serving import Scorer, ScorerFactory, ServingOptions, UnsupportedOption
from tests.pipeline.factories import TINY_SPEC, prepared_batch, user_event


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    save_checkpoint(build_ranker(TINY_SPEC, seed=0), TINY_SPEC, path)
    return path


def _warm_ups(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    warmed: list[list[int]] = []
    monkeypatch.setattr(Scorer, "warm_up", lambda self, rows: warmed.append(list(rows)) or 0.0)
    return warmed


def test_one_process_gets_the_precision_and_is_warmed_up_at_the_batch_size(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warmed = _warm_ups(monkeypatch)
    options = ServingOptions(checkpoint, device="cpu", precision=Precision.BF16, batch_rows=512)
    scorer = ScorerFactory(options).create_scorer()
    assert scorer.precision is Precision.BF16
    assert scorer.device == torch.device("cpu")
    assert warmed == [[512, 256]]


def test_a_compiled_quantized_model_is_served_in_one_process(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warmed = _warm_ups(monkeypatch)
    fp32 = ScorerFactory(ServingOptions(checkpoint, device="cpu")).create_scorer()
    options = ServingOptions(checkpoint, device="cpu", quantize=QuantDtype.INT8, compile=True)
    int8 = ScorerFactory(options).create_scorer()
    assert int8.embedding_bytes() < fp32.embedding_bytes()
    assert hasattr(int8.module, "_compiled_call_impl")  # nn.Module.compile() was applied
    assert warmed == [[4096, 2048], [4096, 2048]]


@pytest.mark.parametrize(("option", "value"), [("quantize", QuantDtype.INT8), ("compile", True)])
def test_several_ranks_refuse_what_they_cannot_serve(
    checkpoint: Path, option: str, value: object
) -> None:
    options = ServingOptions(checkpoint, **{option: value})  # type: ignore[arg-type]
    options.check(world_size=1)
    with pytest.raises(UnsupportedOption, match=f"model.{option}"):
        options.check(world_size=2)
    rank = RankContext(rank=1, local_rank=1, world_size=2, local_world_size=2)
    with pytest.raises(UnsupportedOption):  # before anything is loaded or joined
        ScorerFactory(options, rank).create_scorer()


def test_warm_up_runs_a_forward_per_size(checkpoint: Path) -> None:
    scorer = ScorerFactory(ServingOptions(checkpoint, device="cpu", batch_rows=8)).create_scorer()
    calls: list[int] = []
    forward = scorer.forward
    scorer.forward = lambda inp, pad_to=None: calls.append(inp.num_rows) or forward(inp, pad_to)  # type: ignore[method-assign]
    assert scorer.warm_up([64, 32]) >= 0
    assert calls == [64, 32]


def test_on_a_cpu_staging_hands_over_the_input_as_built() -> None:
    batch = prepared_batch([user_event(3)])
    staged = batch.staged
    assert staged.copied is None
    assert staged.ready_input() is staged.model_input
    assert staged.model_input.dense.device == torch.device("cpu")
