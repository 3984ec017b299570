"""The admin client and the logger every librdkafka client of the pipeline logs through.

Example::

    admin = make_admin(settings.kafka.config)
    admin.list_topics(timeout=10)
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka.admin import AdminClient

from pipeline.settings.kafka import KafkaClientConfig

__all__ = ["CLIENT_LOGGER", "make_admin"]

CLIENT_LOGGER = logging.getLogger("pipeline.kafka.librdkafka")
"""Where the clients' own librdkafka log lines go (served by poll/consume/flush): records in
the run's log format, not raw ``%5|...`` lines on stderr."""


def make_admin(kafka: KafkaClientConfig, **extra: Any) -> AdminClient:
    """An admin client of ``kafka.admin`` (``settings.kafka.config``) whose librdkafka lines
    (e.g. ``BGQUEUE`` when it is destroyed) go to :data:`CLIENT_LOGGER`; ``extra`` properties
    override (``log_level``, ``logger``)."""
    conf: dict[str, Any] = {**kafka.admin, "logger": CLIENT_LOGGER, **extra}
    return AdminClient(conf)
