"""The scoring server with ingest workers as threads (no Kafka, no spawned process): every
request scored as the local model scores it, errors back to the worker that sent the batch,
the start barrier, a failed worker, padding steps for the ranks of a sharded model."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from model.features.build import build_model_input
from model.features.model_input import ModelInput
from model.serving import Scorer
from pipeline.ingest.remote_scorer import RemoteScorer
from pipeline.ingest.server import ScoringServer
from pipeline.ingest.workers import IngestWorkerFailed
from pipeline.observability.latency_sketch import RELATIVE_ERROR
from pipeline.observability.metrics import Metrics
from pipeline.runtime.stepping import LocalStep, StepAgreement, StepDecision
from pipeline.stages import score as score_stage
from pipeline.stages.features import build_feature_columns
from pipeline.stages.score import ForwardExecutor
from pipeline.types import PreparedBatch, ScoredBatch
from tests.pipeline.factories import (
    TINY_SPEC,
    DefaultsEnricher,
    batch_of,
    columns,
    tiny_scorer,
    user_event,
)
from tests.pipeline.ingest.threads import ThreadWorkers


def _inputs(worker: int, batches: int) -> list[ModelInput]:
    out = []
    for b in range(batches):
        records = [
            user_event(candidates=1 + (worker + b + e) % 5, user_id=100 * worker + 10 * b + e)
            for e in range(3)
        ]
        events = columns(records)
        enrichment = DefaultsEnricher().enrich(events.user_ids, events.candidate_ids)
        features = build_feature_columns(events, enrichment, TINY_SPEC)
        out.append(build_model_input(features, TINY_SPEC))
    return out


def test_every_batch_of_every_worker_is_scored_as_the_local_model_scores_it() -> None:
    scorer = tiny_scorer()
    inputs = {w: _inputs(w, 4) for w in range(2)}
    expected = {w: [scorer.forward(inp) for inp in inputs[w]] for w in range(2)}
    got: dict[int, list[torch.Tensor]] = {0: [], 1: []}

    def body(index: int, remote: RemoteScorer) -> None:
        for inp in inputs[index]:
            staged = remote.stage_input(inp)  # into the next slot, as stage() does
            got[index].append(remote.forward(staged.ready_input()))

    workers = ThreadWorkers(2, body)
    workers.start()
    server = ScoringServer(scorer, StepAgreement())
    server.run(workers)
    workers.close()

    assert server.scored == 8
    for w in range(2):
        assert len(got[w]) == 4
        for mine, theirs in zip(got[w], expected[w], strict=True):
            assert torch.equal(mine, theirs)
    summary = workers.summary(seconds=5.0)
    assert (summary.events_out, summary.rows_scored, summary.batches) == (3, 30, 2)
    assert summary.first_input_at == 100.0 and summary.last_output_at == 111.0
    assert len(summary.latencies) == 3  # the workers' sketches merged: 0.01, 0.02, 0.02 s
    assert abs(summary.latency_quantile(0.0) - 0.01) <= 0.01 * RELATIVE_ERROR
    assert abs(summary.latency_quantile(1.0) - 0.02) <= 0.02 * RELATIVE_ERROR
    assert [w["worker"] for w in summary.workers] == [0, 1]


class _PoisonScorer(Scorer):
    """The tiny model, failing for batches of ``poison_rows`` rows with ``error``."""

    def __init__(self, poison_rows: int, error: Exception) -> None:
        base = tiny_scorer()
        super().__init__(base.module, base.spec, base.model_version, base.device)
        self.poison_rows = poison_rows
        self.error = error

    def forward(
        self, inp: ModelInput, pad_to: int | None = None, rows: int | None = None
    ) -> torch.Tensor:
        if inp.num_rows == self.poison_rows:
            raise self.error
        return super().forward(inp, pad_to, rows)


def test_a_forward_error_the_events_may_cause_goes_back_to_its_worker_and_serving_goes_on() -> None:
    good, bad = _inputs(0, 2)[0], _inputs(1, 1)[0]
    scorer = _PoisonScorer(bad.num_rows, ValueError("poison row"))
    assert good.num_rows != bad.num_rows
    outcomes: dict[int, list[object]] = {0: [], 1: []}

    def body(index: int, remote: RemoteScorer) -> None:
        for inp in (bad, good) if index == 1 else (good, good):
            try:
                outcomes[index].append(remote.forward(remote.stage_input(inp).ready_input()))
            except ValueError as exc:
                outcomes[index].append(exc)

    workers = ThreadWorkers(2, body)
    workers.start()
    ScoringServer(scorer, StepAgreement()).run(workers)
    workers.close()

    error, after = outcomes[1]
    assert isinstance(error, ValueError) and str(error) == "poison row"  # the same exception
    assert torch.equal(after, tiny_scorer().forward(good))  # served on after the failure
    assert all(isinstance(o, torch.Tensor) for o in outcomes[0])


def test_an_error_of_the_device_or_memory_stops_the_server() -> None:
    inp = _inputs(0, 1)[0]
    scorer = _PoisonScorer(inp.num_rows, MemoryError("out of memory"))
    raised: list[BaseException] = []

    def body(index: int, remote: RemoteScorer) -> None:
        try:
            remote.forward(remote.stage_input(inp).ready_input())
        except BaseException as exc:
            raised.append(exc)
            raise

    workers = ThreadWorkers(1, body)
    workers.start()
    with pytest.raises(MemoryError):
        ScoringServer(scorer, StepAgreement()).run(workers)
    workers.close()  # the worker reads end-of-file: ServerGone, no event's fault
    workers.channels[0].process.join(10)
    assert type(raised[0]).__name__ == "ServerGone"


def test_a_failed_worker_fails_the_rank_once_the_others_are_done() -> None:
    release = threading.Event()
    finished: list[int] = []

    def body(index: int, remote: RemoteScorer) -> None:
        if index == 0:
            raise RuntimeError("worker 0 broke")
        release.wait(10)
        remote.forward(remote.stage_input(_inputs(1, 1)[0]).ready_input())
        finished.append(index)

    workers = ThreadWorkers(2, body)
    workers.start()
    server = ScoringServer(tiny_scorer(), StepAgreement())
    timer = threading.Timer(0.5, release.set)
    timer.start()
    with pytest.raises(IngestWorkerFailed, match="ingest worker 0 exited with code 1"):
        server.run(workers)
    workers.close()
    assert finished == [1] and server.scored == 1  # worker 1 was served to its end


def test_no_worker_starts_before_every_worker_is_ready() -> None:
    second_ready = threading.Event()
    seen: list[bool] = []

    def body(index: int, remote: RemoteScorer) -> None:
        seen.append(second_ready.is_set() or index == 1)

    workers = ThreadWorkers(2, body)
    original = workers._runner

    def runner(index, conn, slots):  # type: ignore[no-untyped-def]
        run = original(index, conn, slots)

        def delayed() -> None:
            if index == 1:
                threading.Event().wait(0.3)  # worker 1 is slow to get ready
                second_ready.set()
            run()

        return delayed

    workers._runner = runner  # type: ignore[method-assign]
    workers.start()
    ScoringServer(tiny_scorer(), StepAgreement()).run(workers)
    workers.close()
    assert seen == [True, True]


class _SpyScorer(Scorer):
    """The tiny model, recording padding forwards and the rows each forward is padded to."""

    def __init__(self) -> None:
        base = tiny_scorer()
        super().__init__(base.module, base.spec, base.model_version, base.device)
        self.padding: list[int] = []
        self.padded_to: list[int | None] = []

    def forward(
        self, inp: ModelInput, pad_to: int | None = None, rows: int | None = None
    ) -> torch.Tensor:
        self.padded_to.append(pad_to)
        return super().forward(inp, pad_to, rows)

    def forward_padding(self, rows: int) -> None:
        self.padding.append(rows)
        super().forward_padding(rows)


class _AgreedStepper:
    """Stands in for the ranks' agreement: another rank always has 5 rows more to score."""

    poll_timeout_s = 0.01
    collective = True

    def agree(self, local: LocalStep) -> StepDecision:
        return StepDecision(run=True, rows=local.rows + 5, stop=local.idle)

    def agree_attempt(self, rows: int | None) -> int | None:
        return None


def test_with_several_ranks_every_step_is_a_forward_padded_to_the_agreed_rows() -> None:
    inp = _inputs(0, 1)[0]
    scorer = _SpyScorer()
    got: list[torch.Tensor] = []

    def body(index: int, remote: RemoteScorer) -> None:
        got.append(remote.forward(remote.stage_input(inp).ready_input()))

    workers = ThreadWorkers(1, body)
    workers.start()
    ScoringServer(scorer, _AgreedStepper()).run(workers)
    workers.close()

    assert scorer.padding and set(scorer.padding) == {5}  # steps without a request of its own
    assert inp.num_rows + 5 in scorer.padded_to  # its request, padded to the agreed rows
    # padding changes no score (a longer batch may round differently in the last bit)
    torch.testing.assert_close(got[0], tiny_scorer().forward(inp), rtol=1e-6, atol=1e-7)


class _ClockScorer(Scorer):
    """The tiny model, whose forward advances a fake clock by one second."""

    def __init__(self, clock: list[float]) -> None:
        base = tiny_scorer()
        super().__init__(base.module, base.spec, base.model_version, base.device)
        self._clock = clock

    def forward(
        self, inp: ModelInput, pad_to: int | None = None, rows: int | None = None
    ) -> torch.Tensor:
        self._clock[0] += 1.0
        return super().forward(inp, pad_to, rows)


def test_a_workers_forward_time_is_its_round_trip_to_the_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's batch policy learns its batch costs from the forward time its executor
    measures (``ScoredBatch.forward_s``, in ``BatchProcessor.take_costs``): the whole round trip,
    the rank's forward included."""
    clock = [0.0]
    monkeypatch.setattr(score_stage, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    scored: list[ScoredBatch] = []

    def body(index: int, remote: RemoteScorer) -> None:
        executor = ForwardExecutor(remote, Metrics())
        records = [user_event(candidates=3, user_id=u) for u in range(4)]
        batch = batch_of(records)
        events = batch.events
        enrichment = DefaultsEnricher().enrich(events.user_ids, events.candidate_ids)
        staged = remote.stage(build_feature_columns(events, enrichment, TINY_SPEC))
        executor.start(PreparedBatch(batch, enrichment, staged))
        done = executor.take(wait=True)
        executor.shutdown()
        assert done is not None
        scored.append(done[1])

    workers = ThreadWorkers(1, body)
    workers.start()
    ScoringServer(_ClockScorer(clock), StepAgreement()).run(workers)
    workers.close()
    assert len(scored) == 1 and scored[0].forward_s == 1.0
    assert scored[0].counts.tolist() == [2, 2, 2, 2]
