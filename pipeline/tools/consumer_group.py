"""Whether a consumer group has joined: its members own every partition of a topic.

Producers that measure latency (``streamrank produce --wait-for-group``, ``bench latency``) wait
for this before sending, so what they measure starts after the pipeline's start-up.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

from pipeline.connectors.kafka.admin import make_admin
from pipeline.settings.kafka import KafkaSettings


class GroupNotReadyError(TimeoutError):
    """The group did not own every partition of the topic in time."""


def assigned_partitions(admin: AdminClient, group_id: str, topic: str) -> set[int]:
    """Partitions of ``topic`` the members of a *stable* ``group_id`` own now.

    Args:
        admin: a client of the cluster.
        group_id: the consumer group.
        topic: the topic whose partitions count.

    Returns:
        The partition numbers (empty while the group is unknown, empty or rebalancing).

    Example::

        assigned_partitions(make_admin(settings.kafka.config), "streamrank", "events")
    """
    try:
        description = admin.describe_consumer_groups([group_id], request_timeout=5)[
            group_id
        ].result()
    except KafkaException:  # unknown group, coordinator still loading
        return set()
    if description.state != ConsumerGroupState.STABLE:
        return set()
    return {
        tp.partition
        for member in description.members
        if member.assignment is not None
        for tp in member.assignment.topic_partitions
        if tp.topic == topic
    }


def topic_partitions(admin: AdminClient, topic: str) -> int:
    """How many partitions ``topic`` has (0 while it does not exist)."""
    metadata = admin.list_topics(topic, timeout=5).topics.get(topic)
    if metadata is None or metadata.error is not None:
        return 0
    return len(metadata.partitions)


def wait_for_assignment(
    settings: KafkaSettings,
    group_id: str,
    topic: str,
    timeout_s: float,
    *,
    poll_s: float = 0.1,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Block until ``group_id`` is stable and its members own every partition of ``topic``.

    Args:
        settings: where the cluster is.
        group_id: the consumer group (the pipeline's ``kafka.group_id``).
        topic: its input topic (it may not exist yet: the pipeline creates it).
        timeout_s: longest to wait.
        poll_s: pause between two looks.
        clock: monotonic seconds (tests pass a fake).
        sleep: pauses ``poll_s`` (tests pass a fake).

    Returns:
        The number of partitions owned (all of the topic's).

    Raises:
        GroupNotReadyError: not so after ``timeout_s``.

    Example::

        wait_for_assignment(settings.kafka, settings.kafka.group_id, settings.topics.input, 120)
    """
    # log_level 4: without librdkafka's info line about unserved background events at exit
    admin = make_admin(settings.config, log_level=4)
    deadline = clock() + timeout_s
    while True:
        total = topic_partitions(admin, topic)
        if total and len(assigned_partitions(admin, group_id, topic)) == total:
            return total
        if clock() >= deadline:
            raise GroupNotReadyError(
                f"consumer group {group_id!r} did not own all partitions of {topic!r} "
                f"within {timeout_s:g}s"
            )
        sleep(poll_s)
