"""Fixtures for the pipeline unit tests: event records, codecs, a shared mock registry, Redis."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from pipeline.settings.codec import CodecSettings, Framing
from pipeline.settings.redis import RedisSettings
from tests.pipeline.connectors.redis.redis_spy import CountingRedis

UTC = dt.UTC


def _make_event(**fields: Any) -> dict[str, Any]:
    """A valid UserEvent record; keyword arguments replace fields."""
    event: dict[str, Any] = {
        "event_id": f"ev-{uuid.uuid4().hex[:8]}",
        "user_id": 42,
        "event_time": dt.datetime(2024, 5, 17, 12, 30, 45, 123_000, tzinfo=UTC),
        "context": {"device": "ios", "country": "DE"},
        "candidate_item_ids": [101, 102, 103],
        "recent_item_ids": [7, 8],
        "num_results": 2,
    }
    event.update(fields)
    return event


EventFactory = Callable[..., dict[str, Any]]


@pytest.fixture
def make_event() -> EventFactory:
    """``make_event(user_id=7)``: a valid UserEvent record with some fields replaced."""
    return _make_event


class _SharedMockRegistry:
    """Stands in for ``SchemaRegistryClient``: one in-memory registry per ``mock://`` URL.

    ``MockSchemaRegistryClient`` keeps its schemas per *instance*; the pipeline builds one client
    per codec (as it should: against a real registry they share the server). Sharing the mock per
    URL gives tests the same picture without a registry server.
    """

    def __init__(self) -> None:
        from confluent_kafka.schema_registry._sync.mock_schema_registry_client import (
            MockSchemaRegistryClient,
        )

        self._mock_cls = MockSchemaRegistryClient
        self.clients: dict[str, Any] = {}

    def __call__(self, conf: dict[str, Any]) -> Any:
        url = conf["url"]
        if not url.startswith("mock://"):
            return SchemaRegistryClient(conf)
        if url not in self.clients:
            self.clients[url] = self._mock_cls(conf)
        return self.clients[url]

    new_client = __call__


@pytest.fixture
def shared_mock_registry(monkeypatch: pytest.MonkeyPatch) -> _SharedMockRegistry:
    """Route every ``mock://`` registry client of this test to one in-memory registry per URL."""
    import confluent_kafka.schema_registry as sr

    shared = _SharedMockRegistry()
    monkeypatch.setattr(sr, "SchemaRegistryClient", shared)
    return shared


@pytest.fixture
def confluent_settings(shared_mock_registry: _SharedMockRegistry) -> CodecSettings:
    """Codec settings in Confluent framing against a fresh in-memory registry."""
    return CodecSettings(
        framing=Framing.CONFLUENT, schema_registry_url=f"mock://test-{uuid.uuid4().hex}"
    )


@pytest.fixture
def redis_settings(local_stack: Any, unique_name: Callable[[str], str]) -> RedisSettings:
    """Settings for the session's Redis with a key prefix of this test's own."""
    return RedisSettings(url=local_stack.redis_url, key_prefix=unique_name("sr"))


@pytest.fixture
def counting_redis(local_stack: Any) -> Iterator[CountingRedis]:
    client = CountingRedis.from_url(local_stack.redis_url)
    assert isinstance(client, CountingRedis)
    yield client
    client.close()
