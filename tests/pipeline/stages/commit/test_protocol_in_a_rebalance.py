"""The commit protocol against a real broker while the group rebalances (cooperative-sticky).

What librdkafka and the broker do here (measured, and what the protocol relies on): once a
member has handed partitions over, the group rebalances a second time to give them to the new
member, which learns of it at its next heartbeat; until that second rebalance ends, every
commit of the member that keeps its other partitions is held, then refused with
``ILLEGAL_GENERATION``. An asynchronous commit sent in that window is therefore not done when it
is sent: a stop in the window must commit its offsets again, after the group has settled.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Producer

from pipeline.connectors.kafka.clients import KafkaClients, connect, make_consumer
from pipeline.connectors.kafka.consumer import InputConsumer
from pipeline.settings.loading import Settings
from pipeline.stages.commit import Checkpointer
from pipeline.types import Partition
from tests.faults.helpers import committed_positions

MESSAGES = 400


def _member(settings: Settings) -> tuple[KafkaClients, set[Partition]]:
    """A member of ``settings``' group on the input topic; its set of assigned partitions."""
    clients = connect(settings.kafka.config, settings.topics, lambda _: None)
    owned: set[Partition] = set()
    clients.consumer.subscribe(
        settings.topics.input, owned.update, owned.difference_update, owned.difference_update
    )
    return clients, owned


def _consume(consumer: InputConsumer, ckpt: Checkpointer, until: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not until():
        assert time.monotonic() < deadline, "the group did not get there in 60 s"
        polled = consumer.consume(100, 0.1)
        ckpt.consumed(polled.topic, polled.partitions, polled.offsets)


def test_a_stop_while_the_group_rebalances_commits_what_its_held_commits_carried(
    settings_factory: Callable[..., Settings], producer_factory: Callable[..., Producer]
) -> None:
    settings = settings_factory()
    topic = settings.topics.input
    producer = producer_factory()
    for i in range(MESSAGES):
        producer.produce(topic, b"event", partition=i % settings.topics.partitions)
    producer.flush(30)

    first, owned = _member(settings)
    assert first.commit_results is not None
    ckpt = Checkpointer(first.consumer, first.producer, commit_results=first.commit_results)
    each = MESSAGES // settings.topics.partitions

    def everything_consumed() -> bool:
        offsets = ckpt.open.next_offsets
        return len(owned) == settings.topics.partitions and all(
            offsets.get(key) == each for key in owned
        )

    _consume(first.consumer, ckpt, everything_consumed)
    second = make_consumer(settings.kafka.config)
    try:
        second.subscribe([topic])
        second.poll(0.1)  # joins: the first member hands half of its partitions over
        _consume(first.consumer, ckpt, lambda: len(owned) == settings.topics.partitions // 2)
        kept = set(owned)
        ckpt.handed_over({(topic, p) for p in range(settings.topics.partitions)} - kept)
        # the window: the second rebalance waits for the new member's next heartbeat
        ckpt.seal_open()
        ckpt.commit_ready()  # sent asynchronously, held by the group
        assert ckpt.uncommitted_events() == len(kept) * each  # not done until answered
        ckpt.flush_and_send(timeout_s=10)  # the stop's commit: nothing blocks on the group
        deadline = time.monotonic() + 30
        while ckpt.uncommitted_events():  # the drain polls (and so does the other member)
            assert time.monotonic() < deadline, f"not committed: {ckpt.commit_error}"
            second.poll(0.1)
            first.consumer.consume(100, 0.1)
            ckpt.send_again()
    finally:
        second.close()
        first.consumer.close()
    assert ckpt.commit_failures > 0, "no commit was refused: the window was not reached"
    committed = committed_positions(settings)
    assert {p: committed.get(p) for _, p in kept} == {p: each for _, p in kept}
