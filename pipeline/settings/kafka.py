"""The ``[kafka]`` section: connection and client settings of the consumer and the producer, and
librdkafka's configuration of each client, built once from them (:class:`KafkaClientConfig`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from pipeline.settings.secrets import MASK, is_secret_name
from pipeline.settings.section import Section

__all__ = ["KafkaClientConfig", "KafkaSettings"]


@dataclass(frozen=True, repr=False)
class KafkaClientConfig:
    """librdkafka's configuration of each client the pipeline makes of ``[kafka]``
    (:attr:`KafkaSettings.config`, built once when the section is read): the clients of
    :mod:`pipeline.connectors.kafka` are made of it (``make_consumer``, ``make_producer``,
    ``make_admin``) and the commit protocol reads its transaction's budget there.

    Values are as librdkafka needs them (secrets in clear); the repr masks every value whose
    name looks secret (:func:`pipeline.settings.secrets.is_secret_name`). Never changed: a
    client adds its own properties to a copy.

    Attributes:
        consumer: the consumer's: offsets committed by us, never automatically;
            ``consumer_extra`` wins over the named keys.
        producer: the producer's: idempotent, ``acks=all``, batched with linger;
            ``producer_extra`` wins over the named keys.
        admin: the admin client's: the connection only.
        fixed_group: ``consumer_extra`` names ``group.id`` (it wins over a tool's own group,
            ``make_consumer(group_id=...)``, as over ``kafka.group_id``).

    Example::

        consumer = make_consumer(settings.kafka.config)
    """

    consumer: Mapping[str, Any]
    producer: Mapping[str, Any]
    admin: Mapping[str, Any]
    fixed_group: bool = False

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{name}={_masked(getattr(self, name))!r}" for name in ("consumer", "producer", "admin")
        )
        return f"KafkaClientConfig({shown}, fixed_group={self.fixed_group})"


def _masked(conf: Mapping[str, Any]) -> dict[str, Any]:
    return {k: MASK if is_secret_name(k) else v for k, v in conf.items()}


class KafkaSettings(Section):
    """Connection and client settings shared by the consumer and the producer.

    Snake-case fields map onto librdkafka's dotted keys (``security_protocol`` ->
    ``security.protocol``); ``consumer_extra``/``producer_extra`` pass any other librdkafka
    property straight through (they win over the fields here). librdkafka's configuration of
    each client is built from them once, when the section is read (:attr:`config`).
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    group_id: str = "streamrank"
    client_id: str = "streamrank"
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    auto_offset_reset: str = "earliest"
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    """How often a member tells the group it is alive, and learns that the group rebalances.
    librdkafka's default is 3,000; a cooperative rebalance takes two rounds, the second one
    starting at each member's next heartbeat, and until it ends the partitions being moved are
    consumed by nobody and the group holds every commit (measured: the second round took 3.0 s
    with the default and 1.0 s with 1,000). Must be less than ``session_timeout_ms``."""
    max_poll_interval_ms: int = 300_000
    linger_ms: int = 5
    compression_type: str = "lz4"
    consumer_extra: dict[str, str | int | float | bool | SecretStr] = Field(default_factory=dict)
    producer_extra: dict[str, str | int | float | bool | SecretStr] = Field(default_factory=dict)
    """Values whose name looks secret (:func:`pipeline.settings.secrets.is_secret_name`) are kept as
    ``SecretStr``: masked wherever the settings are printed."""

    @field_validator("consumer_extra", "producer_extra", mode="before")
    @classmethod
    def _hide_secrets(cls, extra: Any) -> Any:
        if not isinstance(extra, dict):
            return extra
        return {
            k: SecretStr(v) if isinstance(v, str) and is_secret_name(k) else v
            for k, v in extra.items()
        }

    _config: KafkaClientConfig = PrivateAttr()

    @model_validator(mode="after")
    def _build_config(self) -> KafkaSettings:
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be above 0 and "
                f"below session_timeout_ms ({self.session_timeout_ms})"
            )
        self._config = self._client_config()
        return self

    @property
    def config(self) -> KafkaClientConfig:
        """librdkafka's configuration of the consumer, the producer and the admin client, made
        once when the section was read (a copy with changes, ``model_copy(update=...)``, makes
        its own)."""
        return self._config

    def _client_config(self) -> KafkaClientConfig:
        common: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "client.id": self.client_id,
        }
        optional = {
            "security.protocol": self.security_protocol,
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password.get_secret_value() if self.sasl_password else None,
            "ssl.ca.location": self.ssl_ca_location,
        }
        common.update({k: v for k, v in optional.items() if v is not None})
        consumer = {
            **common,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": self.auto_offset_reset,
            "session.timeout.ms": self.session_timeout_ms,
            "heartbeat.interval.ms": self.heartbeat_interval_ms,
            "max.poll.interval.ms": self.max_poll_interval_ms,
            "partition.assignment.strategy": "cooperative-sticky",
            **_revealed(self.consumer_extra),
        }
        producer = {
            **common,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": self.linger_ms,
            "compression.type": self.compression_type,
            **_revealed(self.producer_extra),
        }
        return KafkaClientConfig(consumer, producer, common, "group.id" in self.consumer_extra)


def _revealed(extra: dict[str, Any]) -> dict[str, Any]:
    """Client settings as librdkafka needs them (secret values in clear)."""
    return {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in extra.items()}
