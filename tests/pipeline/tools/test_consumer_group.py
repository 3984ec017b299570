"""Waiting for a consumer group to own a topic, against the real broker."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import Consumer

from pipeline.settings.loading import Settings
from pipeline.tools.consumer_group import GroupNotReadyError, wait_for_assignment


def test_a_group_nobody_joined_is_not_ready(settings_factory: Callable[..., Settings]) -> None:
    settings = settings_factory()
    with pytest.raises(GroupNotReadyError, match=settings.kafka.group_id):
        wait_for_assignment(settings.kafka, settings.kafka.group_id, settings.topics.input, 0.0)


def test_a_missing_topic_is_not_owned(settings_factory: Callable[..., Settings]) -> None:
    settings = settings_factory()
    with pytest.raises(GroupNotReadyError):
        wait_for_assignment(settings.kafka, settings.kafka.group_id, "no-such-topic-here", 0.0)


def test_ready_once_the_member_owns_every_partition(
    settings_factory: Callable[..., Settings],
    consumer_factory: Callable[..., Consumer],
) -> None:
    settings = settings_factory()
    consumer = consumer_factory(settings.topics.input, **{"group.id": settings.kafka.group_id})
    assigned: list[int] = []

    def on_assign(_consumer: Consumer, partitions: list) -> None:
        assigned.extend(p.partition for p in partitions)

    consumer.subscribe([settings.topics.input], on_assign=on_assign)
    for _ in range(300):  # serve the join (callbacks run in poll)
        consumer.poll(0.1)
        if len(assigned) == settings.topics.partitions:
            break
    owned = wait_for_assignment(
        settings.kafka, settings.kafka.group_id, settings.topics.input, timeout_s=60
    )
    assert owned == settings.topics.partitions
