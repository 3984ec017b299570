"""Recording a drain's batches at the scorer and replaying them alone: what the pipeline's
forward received is what is replayed (saved and loaded too), warm-up is not recorded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.observability.metrics import Metrics
from pipeline.stages.score import ForwardExecutor
from pipeline.tools.bench.replay import Recording, RecordingScorer, replay
from tests.pipeline.factories import prepared_batch, tiny_scorer, user_event


def test_the_batches_the_forward_received_are_recorded_and_replayed(tmp_path: Path) -> None:
    scorer = tiny_scorer()
    recording = Recording(limit=2)
    recorder = RecordingScorer(scorer, recording)
    executor = ForwardExecutor(recorder, Metrics(), warm_up_rows=(16, 8))
    assert recording.batches == []  # the warm-up forwards are not the drain's
    batches = [prepared_batch([user_event(n), user_event(2)], recorder) for n in (3, 5, 4)]
    for prepared in batches:
        executor.start(prepared)  # on the scoring thread, as with overlap
        done = executor.take(wait=True)
        assert done is not None
    executor.shutdown()
    assert recording.rows == [5, 7] and recording.skipped == 1
    assert [name for name, _ in recording.threads] == ["forward_0", "forward_0"]
    assert all(n == torch.get_num_threads() for _, n in recording.threads)
    assert recording.batches[0] is batches[0].staged.model_input  # a reference, no copy
    assert recorder.model_version == scorer.model_version  # everything else is the inner one's

    recording.save(tmp_path / "rec", {"model_version": scorer.model_version})
    loaded, meta = Recording.load(tmp_path / "rec", scorer.device)
    assert meta["batch_rows"] == [5, 7] and meta["model_version"] == "tiny-1"
    assert meta["recorded_with"]["torch_threads"] == torch.get_num_threads()
    for kept, back in zip(recording.batches, loaded.batches, strict=True):
        torch.testing.assert_close(scorer.forward(back), scorer.forward(kept), rtol=0, atol=0)
    assert loaded.forward_s == pytest.approx(recording.forward_s, abs=1e-6)

    result = replay(scorer, loaded, seconds=0.05)
    assert result.passes >= 1 and result.rows_per_s > 0 and len(result.batch_ms) == 2
    figures = result.as_dict()
    assert figures["pipeline_over_replay"] > 0
    assert figures["torch_threads"] == torch.get_num_threads()


def test_an_empty_recording_cannot_be_replayed() -> None:
    with pytest.raises(ValueError, match="nothing was recorded"):
        replay(tiny_scorer(), Recording(), seconds=0.01)
