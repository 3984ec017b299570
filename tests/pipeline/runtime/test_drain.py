"""The drain's commit holds whatever the group does: while the group rebalances it polls with
every partition paused and commits again; it leaves only once every member has committed; what
it cannot commit is said in one log line. Partitions handed over keep nothing to commit later."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaError

from pipeline.ingest.stepping import IdleFlags, WorkerStepper
from pipeline.runtime.stepping import StepAgreement
from pipeline.types import Shutdown
from tests.pipeline.runtime.drains import GroupConsumer, T, rig

EVERYTHING = {(T, 0): 2, (T, 1): 2}


def _drain_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "pipeline.runtime.drain" and r.levelno >= logging.ERROR
    ]


class OtherMembersCommitting(StepAgreement):
    """Another member of the job is still committing for ``rounds`` barrier rounds."""

    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.rounds = rounds
        self.seen: list[bool] = []

    def all_drained(self, done: bool) -> bool:
        self.seen.append(done)
        self.rounds -= 1
        return done and self.rounds < 0


def test_a_commit_refused_by_a_rebalancing_group_is_made_once_it_settles() -> None:
    consumer = GroupConsumer(busy=3)
    r = rig(consumer=consumer)
    r.drain.finish()
    r.drain.commit()
    assert consumer.committed == EVERYTHING
    assert consumer.attempts == 4  # refused 3 times, each followed by a poll; committed
    assert consumer.paused and set(consumer.paused[0]) == {(T, 0), (T, 1)}  # polled paused
    assert consumer.resumed == []  # and never resumed: it is leaving
    assert r.checkpointer.uncommitted_events() == 0


@pytest.mark.parametrize("error", [KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID])
def test_a_member_that_must_rejoin_commits_after_it_has(error: int) -> None:
    consumer = GroupConsumer(busy=2, error=error)
    r = rig(consumer=consumer)
    r.drain.finish()
    r.drain.commit()
    assert consumer.committed == EVERYTHING


def test_a_refusal_that_waiting_cannot_cure_is_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = GroupConsumer(busy=10**6, error=KafkaError.GROUP_AUTHORIZATION_FAILED)
    r = rig(consumer=consumer)
    r.drain.finish()
    with caplog.at_level(logging.ERROR, logger="pipeline.runtime.drain"):
        r.drain.commit()
    assert consumer.attempts == 1  # not sent again
    polls = [call for call in consumer.consume_calls if call[1] > 0]
    assert len(polls) == 1  # one poll to hear the answer, no settling after it
    (line,) = _drain_errors(caplog)
    assert "offsets of 4 consumed events are not committed" in line
    assert "GROUP_AUTHORIZATION_FAILED" in line


def test_a_group_that_never_settles_is_given_up_at_the_shutdown_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = GroupConsumer(busy=10**6)
    shutdown = Shutdown(0.5)
    r = rig(consumer=consumer, shutdown=shutdown)
    r.drain.finish()
    shutdown.request()
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="pipeline.runtime.drain"):
        r.drain.commit()
    assert time.monotonic() - started < 0.5 + 1.0  # the deadline, and one last poll
    assert consumer.attempts > 1 and consumer.committed == {}
    (line,) = _drain_errors(caplog)
    assert "offsets of 4 consumed events are not committed" in line
    assert "REBALANCE_IN_PROGRESS" in line


def test_a_member_leaves_only_once_every_member_has_committed() -> None:
    stepper = OtherMembersCommitting(rounds=3)
    r = rig(stepper=stepper)
    r.drain.finish()
    r.drain.commit()
    assert stepper.seen == [False, True, True, True]  # answered at the first poll, waited
    assert len(r.consumer.consume_calls) >= 1 + 3  # polling (paused) while it waited
    assert r.consumer.committed == EVERYTHING


def test_offsets_left_uncommitted_at_a_revocation_are_never_committed_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = GroupConsumer(busy=10**6)
    r = rig(consumer=consumer)
    with caplog.at_level(logging.ERROR, logger="pipeline.runtime.drain"):
        r.handler.on_revoke({(T, 1)})
    (line,) = _drain_errors(caplog)
    assert "offsets of 2 consumed events are not committed" in line  # partition 1's
    consumer.busy = 0
    r.checkpointer.flush_and_commit()
    assert consumer.committed == {(T, 0): 2}  # the new owner's offsets are not moved back


def test_workers_of_a_rank_wait_only_for_the_workers_that_drain() -> None:
    flags = IdleFlags.allocate(3)
    first, second = WorkerStepper(flags, 0), WorkerStepper(flags, 1)
    assert first.all_drained(True)  # nobody else drains: it does not wait
    assert not second.all_drained(False)  # the second one drains now ...
    assert not first.all_drained(True)  # ... and is waited for
    assert second.all_drained(True) and first.all_drained(True)
    third = WorkerStepper(flags, 2)
    assert not third.all_drained(False)
    third.leave()  # a worker that exited holds nobody back
    assert first.all_drained(True)


def test_a_worker_waits_for_a_draining_worker_until_its_deadline_at_most() -> None:
    flags = IdleFlags.allocate(2)
    flags.drained(1, False)  # worker 1 drains and never ends (killed mid-drain)
    shutdown = Shutdown(0.3)
    r = rig(stepper=WorkerStepper(flags, 0), shutdown=shutdown)
    r.drain.finish()
    shutdown.request()
    started = time.monotonic()
    r.drain.commit()
    assert time.monotonic() - started < 0.3 + 1.0
    assert r.consumer.committed == EVERYTHING and len(r.consumer.consume_calls) > 1
