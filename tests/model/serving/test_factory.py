"""The model factory: options -> served model (precision, graph shapes, refusals), and the
warm-up the scoring thread runs before the consumer joins."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from model.options import Precision, QuantDtype
from model.rank import RankContext
from model.ranker import build_ranker
from model.serving import Scorer, ScorerFactory, ServingOptions, UnsupportedOption
from model.serving.graph_shapes import graph_shapes, shape_for
from model.store.checkpoint import save_checkpoint
from pipeline.observability.metrics import Metrics
from pipeline.settings.batching import BatchingSettings
from pipeline.stages.features import build_feature_columns
from pipeline.stages.score import ForwardExecutor
from tests.pipeline.factories import TINY_SPEC, prepared_batch, user_event


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    path = tmp_path / "model"
    save_checkpoint(build_ranker(TINY_SPEC, seed=0), TINY_SPEC, path)
    return path


def test_one_process_gets_the_precision(checkpoint: Path) -> None:
    options = ServingOptions(checkpoint, device="cpu", precision=Precision.BF16, max_batch_rows=512)
    scorer = ScorerFactory(options).create_scorer()
    assert scorer.precision is Precision.BF16
    assert scorer.device == torch.device("cpu")
    assert scorer.graph_shapes == ()  # no CUDA graphs on a CPU


def test_the_scoring_thread_warms_up_at_the_batch_size_before_returning(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    warmed: list[tuple[str, list[int]]] = []
    monkeypatch.setattr(
        Scorer,
        "warm_up",
        lambda self, rows: warmed.append((threading.current_thread().name, list(rows))) or 0.0,
    )
    batching = BatchingSettings(max_batch_rows=512)
    options = ServingOptions(checkpoint, device="cpu", max_batch_rows=batching.max_batch_rows)
    executor = ForwardExecutor(
        ScorerFactory(options).create_scorer(), Metrics(), batching.warm_up_rows
    )
    assert [rows for _, rows in warmed] == [[512, 256]]
    assert warmed[0][0].startswith("forward")  # not the caller's thread
    executor.shutdown()


def test_a_compiled_quantized_model_is_served_in_one_process(checkpoint: Path) -> None:
    fp32 = ScorerFactory(ServingOptions(checkpoint, device="cpu")).create_scorer()
    options = ServingOptions(checkpoint, device="cpu", quantize=QuantDtype.INT8, compile=True)
    int8 = ScorerFactory(options).create_scorer()
    assert int8.embedding_bytes() < fp32.embedding_bytes()
    assert hasattr(int8.module, "_compiled_call_impl")  # nn.Module.compile() was applied


def test_batches_padded_to_graph_shapes_score_their_rows_as_before(checkpoint: Path) -> None:
    plain = ScorerFactory(ServingOptions(checkpoint, device="cpu")).create_scorer()
    shapes = graph_shapes(plain.spec, 64)
    padded = Scorer(plain.module, plain.spec, "v", plain.device, graph_shapes=shapes)
    prepared = prepared_batch([user_event(5), user_event(3)], plain)
    features = build_feature_columns(prepared.batch.events, prepared.enrichment, plain.spec)
    staged = padded.stage(features).ready_input()
    assert staged.num_rows == shape_for(8, shapes).padded_rows  # a graph's static shape
    want = plain.forward(prepared.staged.ready_input())
    got = padded.forward(staged, rows=8)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    calls = _count_forwards(padded)
    _assert_timed(padded, [])
    # every graph shape, three times (eager warm-up, recording, one replay), padded to it
    assert calls == [s.padded_rows for s in shapes for _ in range(3)]


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
    scorer = ScorerFactory(
        ServingOptions(checkpoint, device="cpu", max_batch_rows=8)
    ).create_scorer()
    calls = _count_forwards(scorer)
    _assert_timed(scorer, [64, 32])
    assert calls == [64, 32]


def _count_forwards(scorer: Scorer) -> list[int]:
    """The row count of every forward ``scorer`` runs from now on."""
    calls: list[int] = []
    forward = scorer.forward
    scorer.forward = lambda inp, pad_to=None, rows=None: (  # type: ignore[method-assign]
        calls.append(inp.num_rows) or forward(inp, pad_to, rows)
    )
    return calls


def _assert_timed(scorer: Scorer, rows: list[int]) -> None:
    """``warm_up`` returns the seconds it took: more than nothing, at most the wall time."""
    started = time.perf_counter()
    seconds = scorer.warm_up(rows)
    assert 0 < seconds <= time.perf_counter() - started


def test_on_a_cpu_staging_hands_over_the_input_as_built() -> None:
    batch = prepared_batch([user_event(3)])
    staged = batch.staged
    assert staged.copied is None
    assert staged.ready_input() is staged.model_input
    assert staged.model_input.dense.device == torch.device("cpu")
