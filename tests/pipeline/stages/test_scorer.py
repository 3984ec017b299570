"""The Scorer: settings -> served model (precision, warm-up before joining), staging."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model.checkpoint import save_checkpoint
from model.options import Precision
from model.ranker import build_ranker
from pipeline.config import ModelSettings
from pipeline.stages.score import Scorer
from tests.pipeline.factories import TINY_SPEC, prepared_batch, user_event


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    save_checkpoint(build_ranker(TINY_SPEC, seed=0), TINY_SPEC, path)
    return path


def test_from_settings_applies_precision_and_skips_warm_up_on_an_eager_cpu_model(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warmed: list[list[int]] = []
    monkeypatch.setattr(Scorer, "warm_up", lambda self, rows: warmed.append(list(rows)) or 0.0)
    model = ModelSettings(checkpoint=checkpoint, device="cpu", precision="bf16")
    scorer = Scorer.from_settings(model, batch_rows=512)
    assert scorer.precision is Precision.BF16
    assert warmed == [[]]


def test_a_compiled_model_is_warmed_up_at_the_batch_size_before_serving(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warmed: list[list[int]] = []
    monkeypatch.setattr(Scorer, "warm_up", lambda self, rows: warmed.append(list(rows)) or 0.0)
    Scorer.from_settings(ModelSettings(checkpoint=checkpoint, compile=True), batch_rows=512)
    assert warmed == [[512, 256]]


def test_warm_up_runs_a_forward_per_size(checkpoint: Path) -> None:
    scorer = Scorer.from_checkpoint(checkpoint, "cpu")
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
