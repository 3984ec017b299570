"""``produce_events`` on the real broker: the records are returned when kept, and a run that
keeps none (``streamrank produce``) still sends every event, paced and all."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.settings.loading import Settings
from pipeline.tools.synthetic_io import build_world, produce_events
from tests.integration.conftest import produced_count


def test_every_event_is_sent_whether_its_record_is_kept_or_not(
    settings_factory: Callable[..., Settings],
) -> None:
    kept_settings, dropped_settings = settings_factory(), settings_factory()
    world = build_world(kept_settings)

    kept = produce_events(kept_settings, world, 30, malformed=2, seed=1)
    dropped = produce_events(
        dropped_settings, world, 30, malformed=2, seed=1, rate=600.0, keep_records=False
    )

    assert (kept.events, kept.malformed, len(kept.records)) == (30, 2, 30)
    assert (dropped.events, dropped.malformed, dropped.records) == (30, 2, [])
    assert produced_count(kept_settings, kept_settings.topics.input) == 32
    assert produced_count(dropped_settings, dropped_settings.topics.input) == 32
