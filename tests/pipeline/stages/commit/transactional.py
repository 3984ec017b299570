"""Fakes of a transactional producer (librdkafka's error classes, scripted calls, a fake clock)
for the exactly-once tests of the commit stage and the loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from tests.pipeline.fakes import FakeConsumer, FakeProducer


class FakeClock:
    """Seconds that pass only when a test (or a fake call) says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def retriable(code: int = KafkaError._TIMED_OUT) -> KafkaException:
    return KafkaException(KafkaError(code, "coordinator unreachable", retriable=True))


def abortable() -> KafkaException:
    return KafkaException(
        KafkaError(KafkaError.UNKNOWN_MEMBER_ID, "unknown member", txn_requires_abort=True)
    )


def fatal() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer producer", fatal=True))


Script = list[KafkaException | Callable[[], None]]
"""What the next calls of one transactional method do: raise an error, or run a function (which
may block); the call succeeds once the script is empty."""


class TxnProducer(FakeProducer):
    """Records the transactional calls in order; each call takes ``call_s`` of the fake clock
    and follows its script."""

    def __init__(self, clock: FakeClock, call_s: float = 1.0) -> None:
        super().__init__()
        self.clock = clock
        self.call_s = call_s
        self.calls: list[str] = []
        self.sent_offsets: list[dict[tuple[str, int], int]] = []
        self.scripts: dict[str, Script] = {}

    def _run(self, name: str) -> None:
        self.calls.append(name)
        self.clock.advance(self.call_s)
        script = self.scripts.get(name)
        if script:
            step = script.pop(0)
            if isinstance(step, KafkaException):
                raise step
            step()

    def init_transactions(self, timeout: float) -> None:
        self._run("init")

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send_offsets_to_transaction(
        self, offsets: list[Any], metadata: Any, timeout: float
    ) -> None:
        assert metadata == "group-metadata"
        self._run("offsets")
        self.sent_offsets.append({(tp.topic, tp.partition): tp.offset for tp in offsets})

    def commit_transaction(self, timeout: float) -> None:
        self._run("commit")

    def abort_transaction(self, timeout: float) -> None:
        self._run("abort")


class GroupConsumer(FakeConsumer):
    def consumer_group_metadata(self) -> str:
        return "group-metadata"
