"""The ``[kafka]`` section: connection and client settings of the consumer and the producer."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator

from pipeline.settings.secrets import is_secret_name
from pipeline.settings.section import Section

__all__ = ["KafkaSettings"]


class KafkaSettings(Section):
    """Connection and client settings shared by the consumer and the producer.

    Snake-case fields map onto librdkafka's dotted keys (``security_protocol`` ->
    ``security.protocol``); ``consumer_extra``/``producer_extra`` pass any other librdkafka
    property straight through (they win over the fields here).
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
    max_poll_interval_ms: int = 300_000
    linger_ms: int = 5
    compression_type: str = "lz4"
    consumer_extra: dict[str, SecretStr | str | int | float | bool] = Field(default_factory=dict)
    producer_extra: dict[str, SecretStr | str | int | float | bool] = Field(default_factory=dict)
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

    def _common(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
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
        conf.update({k: v for k, v in optional.items() if v is not None})
        return conf

    def consumer_config(self, group_id: str | None = None) -> dict[str, Any]:
        """librdkafka consumer configuration. Offsets are committed by us, never automatically."""
        conf = self._common()
        conf.update(
            {
                "group.id": group_id or self.group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": self.auto_offset_reset,
                "session.timeout.ms": self.session_timeout_ms,
                "max.poll.interval.ms": self.max_poll_interval_ms,
                "partition.assignment.strategy": "cooperative-sticky",
            }
        )
        conf.update(_revealed(self.consumer_extra))
        return conf

    def producer_config(self) -> dict[str, Any]:
        """librdkafka producer configuration: idempotent, acks=all, batched with linger."""
        conf = self._common()
        conf.update(
            {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": self.linger_ms,
                "compression.type": self.compression_type,
            }
        )
        conf.update(_revealed(self.producer_extra))
        return conf

    def admin_config(self) -> dict[str, Any]:
        return self._common()


def _revealed(extra: dict[str, Any]) -> dict[str, Any]:
    """Client settings as librdkafka needs them (secret values in clear)."""
    return {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in extra.items()}
