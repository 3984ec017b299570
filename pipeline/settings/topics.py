"""The ``[topics]`` section: topic names, and how to create missing topics."""

from __future__ import annotations

from pipeline.settings.section import Section


class TopicsSettings(Section):
    """Topic names, and how to create them when missing."""

    input: str = "user-events"
    output: str = "recommendations"
    dlq: str = "user-events-dlq"
    create_missing: bool = True
    partitions: int = 4
    replication_factor: int = 1
