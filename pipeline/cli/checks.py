"""Checks a command runs before its work: they raise :class:`UserError` with what to do.

Each probe has a short timeout, so a wrong address fails in seconds, not after the first batch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pipeline.cli.errors import UserError
from pipeline.config import KafkaSettings, RedisSettings
from pipeline.secrets import mask_url

KAFKA_PROBE_TIMEOUT_S = 5.0
REDIS_PROBE_TIMEOUT_S = 2.0


def _silent_logger() -> logging.Logger:
    """A logger that drops librdkafka's connection-refused lines (the check reports them)."""
    logger = logging.getLogger("streamrank.probe")
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


def require_kafka(kafka: KafkaSettings, timeout_s: float = KAFKA_PROBE_TIMEOUT_S) -> None:
    """Raise :class:`UserError` unless a broker of ``kafka.bootstrap_servers`` answers.

    Args:
        kafka: the cluster to ask for its metadata.
        timeout_s: how long to wait for an answer.

    Example::

        require_kafka(settings.kafka)
    """
    conf: dict[str, Any] = {**kafka.admin_config(), "logger": _silent_logger()}
    admin = AdminClient(conf)
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as error:
        raise UserError(
            f"Kafka broker unreachable at {kafka.bootstrap_servers} "
            f"(kafka.bootstrap_servers): {error.args[0].str()} after {timeout_s:g}s"
        ) from error


def require_redis(settings: RedisSettings, timeout_s: float = REDIS_PROBE_TIMEOUT_S) -> None:
    """Raise :class:`UserError` unless the Redis at ``settings.url`` answers a PING.

    Args:
        settings: the feature store's URL.
        timeout_s: connect and read timeout of the PING.

    Example::

        require_redis(settings.redis)
    """
    client = redis.Redis.from_url(
        settings.url,
        socket_connect_timeout=timeout_s,
        socket_timeout=timeout_s,
        **settings.client_kwargs(),
    )
    try:
        client.ping()
    except redis.RedisError as error:
        raise UserError(
            f"Redis unreachable at {mask_url(settings.url)} (redis.url): {error}"
        ) from error
    finally:
        client.close()


def require_checkpoint(path: Path) -> Path:
    """The checkpoint directory to serve, or :class:`UserError` when there is none.

    Args:
        path: ``model.checkpoint``: a checkpoint directory, or a versions directory
            (:mod:`model.versions`), whose current version is served.

    Returns:
        ``path`` itself, or the current version's directory.
    """
    from model.versions import NoCurrentVersionError, resolve_checkpoint

    try:
        return resolve_checkpoint(path)
    except NoCurrentVersionError as error:
        raise UserError(f"{error} (model.checkpoint)") from error
    except FileNotFoundError as error:
        if (path / "current.json").is_file():  # a versions directory lost its current version
            raise UserError(f"{error} (model.checkpoint {path})") from error
        raise UserError(
            f"no model at {path} (model.checkpoint): run `streamrank init-model` first, "
            "or point model.checkpoint at a checkpoint or a versions directory"
        ) from error
    except ValueError as error:  # a corrupt current.json
        raise UserError(f"{error} (model.checkpoint)") from error


def require_free_checkpoint_path(path: Path, overwrite: bool) -> None:
    """Raise :class:`UserError` when ``path`` exists and ``overwrite`` is off.

    Args:
        path: where a new checkpoint is to be saved.
        overwrite: whether replacing an existing checkpoint is wanted.
    """
    if path.exists() and not overwrite:
        raise UserError(
            f"checkpoint path already exists: {path}; pass --overwrite to replace it "
            "(or --out DIR to save elsewhere)"
        )
