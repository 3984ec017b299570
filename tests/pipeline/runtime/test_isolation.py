"""Poison isolation on fake Kafka clients: a batch that fails after decode is bisected, the
failing events are dead-lettered with ``processing_error``, the rest scored, all committed.

Failures are injected through the enricher and scorer the pipeline takes as arguments
(:mod:`tests.support.faults`)."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest

from pipeline.runtime.isolation import bisect, is_isolatable
from pipeline.runtime.stepping import LocalStep, StepDecision, Stepper
from pipeline.settings.batching import BatchingSettings
from pipeline.stages.dead_letter import DETAIL_HEADER, REASON_HEADER
from pipeline.types import DeliveryFailed
from tests.pipeline.factories import (
    DefaultsEnricher,
    encode_events,
    event_messages,
    tiny_scorer,
    user_event,
)
from tests.pipeline.fakes import FakeConsumer, FakeProducer
from tests.pipeline.runtime.loops import DLQ, IN, fake_loop, loop_settings, published_event_ids
from tests.support.faults import FailingEnricher, FailingScorer, InjectedFault

POISON_USER = 9_999
POISON_RESULTS = 999


def _records(n: int, enrich_poison: set[int], score_poison: set[int]) -> list[dict[str, Any]]:
    records = [user_event(candidates=3) for _ in range(n)]
    for i in enrich_poison:
        records[i]["user_id"] = POISON_USER
    for i in score_poison:
        records[i]["num_results"] = POISON_RESULTS
    return records


def _run(
    records: list[dict[str, Any]], overlap: bool = False, stepper: Stepper | None = None
) -> tuple[list[str], FakeProducer, FakeConsumer]:
    consumer = FakeConsumer(
        messages=deque(event_messages(IN, encode_events(records))), partitions=[(IN, 0)]
    )
    producer = FakeProducer(ack_every_poll=True)
    settings = loop_settings(
        BatchingSettings(max_batch_rows=1000, max_delay_ms=5, overlap_forward=overlap)
    )
    pipeline = fake_loop(
        settings,
        consumer,
        producer,
        scorer=FailingScorer(tiny_scorer(), {POISON_RESULTS}),
        enricher=FailingEnricher(DefaultsEnricher(), {POISON_USER}),
        stepper=stepper,
    )
    pipeline.batcher.max_delay_s = 60  # one batch: the stop closes it
    pipeline.stop()
    pipeline.run()
    return published_event_ids(settings, producer), producer, consumer


@pytest.mark.parametrize("stage", ["enrich", "scoring"])
@pytest.mark.parametrize("overlap", [False, True])
def test_the_poison_event_is_dead_lettered_and_the_rest_of_its_batch_scored(
    stage: str, overlap: bool
) -> None:
    records = _records(
        24, {7} if stage == "enrich" else set(), {7} if stage == "scoring" else set()
    )
    scored, producer, consumer = _run(records, overlap)
    poison = records[7]["event_id"]
    assert scored == [r["event_id"] for r in records if r["event_id"] != poison]  # in order, once
    (dead,) = producer.on_topic(DLQ)
    headers = dict(dead.headers() or [])
    assert headers[REASON_HEADER] == b"processing_error"
    assert f"InjectedFault: injected {stage} failure".encode() in headers[DETAIL_HEADER]
    assert dead.value() == encode_events([records[7]])[0]  # the source message, untouched
    assert consumer.committed == {(IN, 0): len(records)}


def test_two_poison_events_in_different_stages() -> None:
    records = _records(24, {3}, {20})
    scored, producer, consumer = _run(records)
    bad = {records[3]["event_id"], records[20]["event_id"]}
    assert scored == [r["event_id"] for r in records if r["event_id"] not in bad]
    assert len(producer.on_topic(DLQ)) == 2
    assert consumer.committed == {(IN, 0): len(records)}


def test_bisect_finds_each_failing_record_in_few_attempts() -> None:
    records = [{"event_id": str(i)} for i in range(64)]
    bad = {"5", "40"}

    def attempt(group: list[dict[str, str]]) -> int:
        if bad & {r["event_id"] for r in group}:
            raise ValueError("poison")
        return len(group)

    found = bisect(records, attempt, ValueError("poison"))
    assert {r["event_id"] for r, _ in found.failed} == bad
    assert [r["event_id"] for r in found.good_items] == [
        r["event_id"] for r in records if r["event_id"] not in bad
    ]
    assert sum(result for _, result in found.good) == 62
    assert found.attempts <= 4 * 6  # about 2 log2(64) per poison event


def test_an_outage_during_bisection_propagates() -> None:
    def attempt(group: list[dict[str, str]]) -> None:
        raise DeliveryFailed("broker down")

    with pytest.raises(DeliveryFailed):
        bisect([{"a": "1"}, {"a": "2"}], attempt, ValueError("x"))  # type: ignore[arg-type]
    assert not is_isolatable(OSError("redis"))
    assert is_isolatable(InjectedFault("x"))


def test_device_and_communication_errors_are_not_poison() -> None:
    import torch
    import torch.distributed as dist

    assert not is_isolatable(torch.AcceleratorError("CUDA error: an illegal memory access"))
    assert not is_isolatable(dist.DistBackendError("NCCL error"))
    assert is_isolatable(RuntimeError("shape mismatch"))


class _RankStepper:
    """A one-rank stand-in for the ranks' stepper (the loop takes the multi-rank paths)."""

    poll_timeout_s = 0.01
    collective = True

    def __init__(self) -> None:
        self.rounds: list[int | None] = []

    def agree(self, local: LocalStep) -> StepDecision:
        return StepDecision(
            run=local.ready or local.stop_requested,
            rows=local.rows,
            stop=local.stop_requested or local.idle,
            isolate=local.isolate,
            swap=local.offer,
        )

    def agree_attempt(self, rows: int | None) -> int | None:
        self.rounds.append(rows)
        return rows

    def all_ok(self, ok: bool) -> bool:
        return ok

    def all_drained(self, done: bool) -> bool:
        return done


def test_a_rank_isolates_failures_before_the_forward_and_joins_it_with_the_rest() -> None:
    records = _records(16, {5}, set())
    scored, producer, consumer = _run(records, stepper=_RankStepper())
    assert scored == [r["event_id"] for i, r in enumerate(records) if i != 5]
    (dead,) = producer.on_topic(DLQ)
    assert dict(dead.headers() or [])[REASON_HEADER] == b"processing_error"
    assert consumer.committed == {(IN, 0): len(records)}


def test_a_rank_bisects_a_failure_after_the_collective_forward_in_agreed_rounds() -> None:
    records = _records(16, set(), {5})
    stepper = _RankStepper()
    scored, producer, consumer = _run(records, stepper=stepper)
    assert scored == [r["event_id"] for i, r in enumerate(records) if i != 5]
    (dead,) = producer.on_topic(DLQ)
    assert b"injected scoring failure" in dict(dead.headers() or [])[DETAIL_HEADER]
    assert consumer.committed == {(IN, 0): len(records)}
    # Every attempt was one agreed round (a collective forward), then one round said "done".
    assert stepper.rounds[-1] is None and None not in stepper.rounds[:-1]
    assert 2 <= len(stepper.rounds) - 1 <= 2 * 4  # about 2 log2(16) attempts
