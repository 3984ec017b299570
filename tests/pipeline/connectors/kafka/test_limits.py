"""The consumer's fetch limits follow the input topic's record limit, in a combination
librdkafka accepts; the settings keep room on the input topic for a value just over
``codec.max_message_bytes``."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaException

from pipeline.connectors.kafka.limits import FETCH_FLOOR_BYTES, consumer_fetch_limits
from pipeline.settings.codec import CodecSettings
from pipeline.settings.loading import Settings
from pipeline.settings.topics import RECORD_OVERHEAD_BYTES, TopicsSettings


@pytest.mark.parametrize("record_limit", [70_000, 1_048_588, 64 * 2**20])
def test_fetch_limits_hold_one_batch_of_the_topic_and_librdkafka_takes_them(
    record_limit: int,
) -> None:
    limits = consumer_fetch_limits(record_limit)
    assert limits["max.partition.fetch.bytes"] == record_limit
    assert limits["fetch.max.bytes"] == max(record_limit, FETCH_FLOOR_BYTES)
    assert limits["receive.message.max.bytes"] >= limits["fetch.max.bytes"] + 512
    Consumer({"group.id": "limits", **limits}).close()  # librdkafka checks the combination


def test_librdkafka_refuses_a_response_limit_under_the_fetch_limit() -> None:
    """The combination checked above is one librdkafka enforces (so the test can fail)."""
    with pytest.raises(KafkaException, match=r"receive\.message\.max\.bytes"):
        Consumer(
            {"group.id": "limits", "fetch.max.bytes": 2**20, "receive.message.max.bytes": 2**20}
        )


def test_the_input_topic_must_hold_the_largest_event_and_its_framing() -> None:
    codec = CodecSettings(max_message_bytes=2 * 2**20)
    with pytest.raises(ValueError, match=r"topics\.input_max_message_bytes"):
        Settings(codec=codec)
    least = codec.max_message_bytes + RECORD_OVERHEAD_BYTES
    settings = Settings(codec=codec, topics=TopicsSettings(input_max_message_bytes=least))
    assert settings.topics.input_max_message_bytes == least
    default = Settings()
    assert default.topics.input_max_message_bytes >= (
        default.codec.max_message_bytes + RECORD_OVERHEAD_BYTES
    )
