"""The ``[metrics]`` section: the Prometheus endpoint."""

from __future__ import annotations

from pipeline.settings.section import Section


class MetricsSettings(Section):
    """Prometheus endpoint."""

    enabled: bool = True
    """Serve ``/metrics`` (each rank its own)."""
    host: str = "127.0.0.1"
    """The address the endpoint listens on."""
    port: int = 9464
    """Rank 0's port; rank r listens on ``port + r`` (:meth:`port_for`). 0: a free port each."""

    def port_for(self, rank: int) -> int:
        """The port rank ``rank`` serves its metrics on: ``port + rank``, or 0 (any free port)
        when ``port`` is 0.

        Example::

            MetricsSettings(port=9464).port_for(2)  # 9466
        """
        return self.port + rank if self.port else 0
