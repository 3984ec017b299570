"""Exactly-once on fake clients: a transaction that fails is aborted, the loop goes back to the
last committed offsets and goes on, so every event is committed once, in the transactions that
went through (the aborted ones are invisible to ``read_committed`` readers)."""

from __future__ import annotations

from collections import deque
from typing import Any

from confluent_kafka import TopicPartition

from pipeline.connectors.avro.reference import RECOMMENDATION_SCHEMA_FILE, RecordCodec
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.delivery import DeliverySettings, Guarantee
from tests.pipeline.factories import (
    encode_events,
    event_messages,
    user_event,
)
from tests.pipeline.fakes import FakeMessage
from tests.pipeline.runtime.loops import IN, OUT, fake_loop, loop_settings
from tests.pipeline.stages.commit.transactional import (
    FakeClock,
    GroupConsumer,
    TxnProducer,
    abortable,
)


class SeekingConsumer(GroupConsumer):
    """Serves its messages again from an offset it is told to seek to (one partition)."""

    def __init__(self, messages: list[FakeMessage]) -> None:
        super().__init__(messages=deque(messages), partitions=[(IN, 0)])
        self.log = messages

    def seek(self, partition: TopicPartition) -> None:
        super().seek(partition)
        self.messages = deque(m for m in self.log if m.offset() >= partition.offset)


def test_a_failed_transaction_is_aborted_and_its_events_are_scored_again() -> None:
    records = [user_event() for _ in range(30)]
    consumer = SeekingConsumer(event_messages(IN, encode_events(records)))
    producer = TxnProducer(FakeClock(), call_s=0.0)
    producer.ack_every_poll = True
    aborted_at: list[int] = []
    producer.scripts["offsets"] = [abortable()]  # the first transaction fails
    producer.scripts["abort"] = [lambda: aborted_at.append(len(producer.on_topic(OUT)))]
    settings = loop_settings(
        BatchingSettings(max_batch_rows=40, max_delay_ms=5),
        DeliverySettings(guarantee=Guarantee.EXACTLY_ONCE, commit_interval_ms=1),
    )
    pipeline = fake_loop(settings, consumer, producer)
    pipeline.run(exit_when_idle_s=0.2)

    assert producer.calls.count("abort") == 1 and consumer.seeks == [(IN, 0, 0)]
    assert producer.sent_offsets[-1] == {(IN, 0): 30}  # committed to the end
    codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, OUT)
    after: list[Any] = producer.on_topic(OUT)[aborted_at[0] :]
    ids = [codec.decode(r.value() or b"")["event_id"] for r in after]
    assert ids == [r["event_id"] for r in records]  # the transactions that went through
    assert aborted_at[0] > 0  # the aborted one held records
