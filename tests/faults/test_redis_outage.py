"""Fault (d) on the real stack: Redis stopped ~10 s mid-stream and restarted on its port.
Events scored during the outage carry the fallback flags; nothing is lost; after the restart
(and a re-seed) features are served again without restarting the pipeline."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from model.synthetic import SyntheticWorld
from pipeline.settings.loading import Settings
from pipeline.settings.redis import RedisSettings
from tests.conftest import RedisServer
from tests.faults.helpers import report, seeded_settings
from tests.integration.conftest import BackgroundPipeline, SentEvents, collect, seed_features

pytestmark = pytest.mark.slow


def test_redis_down_10s_serves_defaults_flags_them_and_recovers(
    settings_factory: Callable[..., Settings],
    trained_checkpoint: Path,
    world: SyntheticWorld,
    redis_server_factory: Callable[[], RedisServer],
    send_events: Callable[..., SentEvents],
    background_pipeline: Callable[[Settings], BackgroundPipeline],
) -> None:
    server = redis_server_factory()
    fast_failing = RedisSettings(
        url=server.url, key_prefix="sr", cache_ttl_s=0.0, retry_after_s=0.5,
        socket_timeout_ms=100, connect_timeout_ms=100,
    )  # fmt: skip
    settings = seeded_settings(settings_factory, trained_checkpoint, world, redis=fast_failing)
    bp = background_pipeline(settings)
    before = send_events(settings, 100)
    assert len(collect(settings, expected=100)) == 100

    server.stop()
    down = send_events(settings, 300)  # scored while Redis is down
    time.sleep(10)
    server.restart()
    seed_features(settings, world)
    restarted = time.monotonic()
    time.sleep(1.0)  # past retry_after_s: the enricher tries Redis again
    after = send_events(settings, 100)
    sent = before.ids | down.ids | after.ids
    recs = collect(settings, expected=500)
    recover_s = time.monotonic() - restarted
    bp.stop()

    missing, duplicates = report("redis-down-10s", sent, recs, recover_s, "at_least_once")
    assert missing == 0 and duplicates == 0
    by_id = {r["event_id"]: r for r in recs}
    for event_id in down.ids:
        assert set(by_id[event_id]["fallback_features"]) == {"user_features", "item_features"}
    assert all(by_id[e]["fallback_features"] == [] for e in after.ids)  # recovered
