"""The ``[metrics]`` section: the Prometheus endpoint."""

from __future__ import annotations

from pipeline.settings.section import Section


class MetricsSettings(Section):
    """Prometheus endpoint."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9464
