"""The clients are made of ``[kafka]``'s librdkafka configuration, built once when the settings
were read (``settings.kafka.config``): what each client gets, a tool's consumer in a group of its
own, and the configuration itself never changed by a client."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.connectors.kafka import admin, clients
from pipeline.connectors.kafka.admin import CLIENT_LOGGER, make_admin
from pipeline.connectors.kafka.clients import log_client_error, make_consumer, make_producer
from pipeline.settings.kafka import KafkaSettings


@pytest.fixture(autouse=True)
def _confs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each client class returns the configuration it would be made with."""
    for module, name in ((clients, "Consumer"), (clients, "Producer"), (admin, "AdminClient")):
        monkeypatch.setattr(module, name, dict)


def _conf(client: Any) -> dict[str, Any]:
    assert isinstance(client, dict)
    return client


def test_each_client_gets_its_config_and_the_config_stays_as_built() -> None:
    kafka = KafkaSettings(group_id="g", consumer_extra={"fetch.min.bytes": 1})
    config = kafka.config
    consumer = _conf(make_consumer(config, defaults={"fetch.min.bytes": 9, "a": 1}, extra={"b": 2}))
    assert consumer == {
        **config.consumer, "a": 1, "b": 2, "error_cb": log_client_error, "logger": CLIENT_LOGGER
    }  # fmt: skip
    assert consumer["fetch.min.bytes"] == 1  # the settings win over defaults
    producer = _conf(make_producer(config, extra={"linger.ms": 0}))
    assert producer == {
        **config.producer, "linger.ms": 0, "error_cb": log_client_error, "logger": CLIENT_LOGGER
    }  # fmt: skip
    assert _conf(make_admin(config, log_level=4)) == {
        **config.admin, "logger": CLIENT_LOGGER, "log_level": 4
    }  # fmt: skip
    assert config == KafkaSettings(group_id="g", consumer_extra={"fetch.min.bytes": 1}).config
    assert "error_cb" not in config.consumer and "logger" not in config.producer


def test_a_tools_consumer_joins_a_group_of_its_own_unless_consumer_extra_names_one() -> None:
    config = KafkaSettings(group_id="g").config
    assert _conf(make_consumer(config, group_id="other"))["group.id"] == "other"
    assert _conf(make_consumer(config))["group.id"] == "g"
    assert config.consumer["group.id"] == "g"  # the shared configuration is unchanged
    pinned = KafkaSettings(group_id="g", consumer_extra={"group.id": "extra"}).config
    assert pinned.consumer["group.id"] == "extra"
    assert _conf(make_consumer(pinned, group_id="other"))["group.id"] == "extra"
