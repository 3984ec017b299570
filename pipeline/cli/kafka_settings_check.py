"""Kafka client settings checked at start-up: librdkafka itself validates them.

librdkafka checks every property when a client is created, not when it is set in the TOML, so a
bad ``kafka.compression_type`` used to pass the pre-flight checks and end the loop with a
``KafkaException``. :func:`check_kafka_client_settings` creates (and closes at once) a producer
and a consumer from the same configuration the pipeline uses, without brokers (no network), first
from the named ``[kafka]`` keys, then with ``consumer_extra`` / ``producer_extra`` added, so each
rejection names the key the user wrote and, for enumerations, the values librdkafka accepts.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from pydantic import SecretStr

from pipeline.cli.errors import UserError
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.secrets import is_secret_name

__all__ = ["VALID_VALUES", "check_kafka_client_settings"]

#: librdkafka property (and its aliases) -> the ``[kafka]`` key that sets it.
_KEY_OF_PROPERTY: dict[str, str] = {
    "client.id": "client_id",
    "group.id": "group_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_ca_location",
    "auto.offset.reset": "auto_offset_reset",
    "session.timeout.ms": "session_timeout_ms",
    "heartbeat.interval.ms": "heartbeat_interval_ms",
    "max.poll.interval.ms": "max_poll_interval_ms",
    "linger.ms": "linger_ms",
    "queue.buffering.max.ms": "linger_ms",
    "compression.type": "compression_type",
    "compression.codec": "compression_type",
}

#: What librdkafka accepts for the enumerated ``[kafka]`` keys (case-insensitive).
VALID_VALUES: dict[str, tuple[str, ...]] = {
    "security_protocol": ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"),
    "compression_type": ("none", "gzip", "snappy", "lz4", "zstd"),
    "auto_offset_reset": ("earliest", "latest", "smallest", "largest", "beginning", "end", "error"),
}

_PROPERTY_IN_MESSAGE = re.compile(r'property:? "([^"]+)"')


def _without_brokers(conf: Mapping[str, Any], logger: logging.Logger) -> dict[str, Any]:
    """``conf`` without bootstrap servers (no connection is made) and with a silent logger."""
    out = {k: v for k, v in conf.items() if k not in ("bootstrap.servers", "metadata.broker.list")}
    out["logger"] = logger
    return out


def _librdkafka_error(
    client_type: type[Producer] | type[Consumer], conf: Mapping[str, Any], logger: logging.Logger
) -> str | None:
    """The message librdkafka rejects ``conf`` with, or ``None`` when it accepts it."""
    try:
        client = client_type(_without_brokers(conf, logger))
    except KafkaException as error:
        return str(error.args[0].str())
    if isinstance(client, Consumer):
        client.close()
    return None


def _named_key_message(kafka: KafkaSettings, message: str) -> str:
    match = _PROPERTY_IN_MESSAGE.search(message)
    key = _KEY_OF_PROPERTY.get(match.group(1), "") if match else ""
    if not key:
        return f"bad [kafka] setting: librdkafka rejects it: {message}"
    value = getattr(kafka, key)
    got = "" if isinstance(value, SecretStr) or is_secret_name(key) else f" (got {value!r})"
    valid = VALID_VALUES.get(key)
    hint = f"; valid: {', '.join(valid)}" if valid else ""
    return f"bad config value for kafka.{key}{got}: librdkafka rejects it: {message}{hint}"


def _extra_message(section: str, message: str) -> str:
    match = _PROPERTY_IN_MESSAGE.search(message)
    name = match.group(1) if match else ""
    shown = "a secret value was rejected" if name and is_secret_name(name) else message
    return (
        f"bad librdkafka property in kafka.{section}: {shown} (any librdkafka {section[:-6]} "
        'property of librdkafka\'s CONFIGURATION.md, e.g. "fetch.min.bytes" = 65536)'
    )


def check_kafka_client_settings(kafka: KafkaSettings, logger: logging.Logger) -> None:
    """Raise :class:`UserError` when librdkafka rejects the producer or consumer configuration.

    Args:
        kafka: the ``[kafka]`` settings (``kafka.config``'s consumer and producer are what the
            pipeline's clients are built from).
        logger: where the throw-away clients log (a silent one: no line reaches the user).

    Example::

        check_kafka_client_settings(settings.kafka, logging.getLogger("streamrank.probe"))
    """
    # a validated copy: its config is built without the extras
    named = kafka.model_copy(update={"consumer_extra": {}, "producer_extra": {}})
    for conf, client_type in (
        (named.config.producer, Producer),
        (named.config.consumer, Consumer),
    ):
        message = _librdkafka_error(client_type, conf, logger)
        if message is not None:
            raise UserError(_named_key_message(kafka, message))
    for section, conf, client_type in (
        ("producer_extra", kafka.config.producer, Producer),
        ("consumer_extra", kafka.config.consumer, Consumer),
    ):
        message = _librdkafka_error(client_type, conf, logger)
        if message is not None:
            raise UserError(_extra_message(section, message))
