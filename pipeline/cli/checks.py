"""Checks a command runs before its work: they raise :class:`UserError` with what to do.

Each probe has a short timeout, so a wrong address fails in seconds, not after the first batch.
The Kafka client settings are checked by building the clients' configuration
(:mod:`pipeline.cli.kafka_settings_check`), so librdkafka rejects a bad value at start-up.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

import redis
from confluent_kafka import KafkaException

from pipeline.cli.errors import UserError
from pipeline.cli.kafka_settings_check import check_kafka_client_settings
from pipeline.connectors.kafka.admin import make_admin
from pipeline.settings.codec import CodecSettings, Framing
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.loading import Settings
from pipeline.settings.redis import RedisSettings
from pipeline.settings.retrieval import CatalogueSource
from pipeline.settings.secrets import mask_url

if TYPE_CHECKING:
    from model.module.store import CheckedVersion
    from pipeline.models.output import OutputContract
    from pipeline.models.preflight import ConfiguredModel

KAFKA_PROBE_TIMEOUT_S = 5.0
REDIS_PROBE_TIMEOUT_S = 2.0
REGISTRY_PROBE_TIMEOUT_S = 5.0
REDIS_URL_SCHEMES = ("redis://", "rediss://", "unix://")
_CUDA_DEVICE = re.compile(r"^cuda(?::(\d+))?$")


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
    check_kafka_client_settings(kafka, _silent_logger())
    admin = make_admin(kafka.config, logger=_silent_logger())
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
    if not settings.url.startswith(REDIS_URL_SCHEMES):
        raise UserError(
            f"bad config value for redis.url (got {mask_url(settings.url)!r}): it must start "
            f"with {', '.join(REDIS_URL_SCHEMES)}, e.g. redis://127.0.0.1:6379/0"
        )
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
            (:mod:`model.store.versions`), whose current version is served.

    Returns:
        ``path`` itself, or the current version's directory.
    """
    from model.store.versions import NoCurrentVersionError, resolve_checkpoint

    try:
        return resolve_checkpoint(path)
    except NoCurrentVersionError as error:
        raise UserError(f"{error} (model.checkpoint)") from error
    except FileNotFoundError as error:
        if (path / "current.json").is_file():  # a versions directory lost its current version
            raise UserError(f"{error} (model.checkpoint {path})") from error
        raise UserError(
            f"no model at {path} (model.checkpoint): run `streamrank init-model` first (with "
            "[model.module]: `streamrank model import STATE_DICT_FILE --promote`), or point "
            "model.checkpoint at a checkpoint or a versions directory"
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


def require_device(device: str) -> None:
    """Raise :class:`UserError` unless ``model.device`` names a device this machine has.

    Args:
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.

    Example::

        require_device(settings.model.device)
    """
    if device in ("auto", "cpu"):
        return
    match = _CUDA_DEVICE.match(device)
    if match is None:
        raise UserError(
            f"bad config value for model.device (got {device!r}): use auto, cpu, cuda or cuda:N"
        )
    import torch  # only when a CUDA device is asked for

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise UserError(
            f"model.device = {device!r} but this machine has no CUDA device "
            "(torch.cuda.is_available() is false): use auto or cpu"
        )
    index = int(match.group(1) or 0)
    if index >= count:
        raise UserError(
            f"model.device = {device!r} but this machine has {count} CUDA device(s): "
            f"use cuda:0..cuda:{count - 1}, cuda or auto"
        )


def require_schema_registry(
    codec: CodecSettings, timeout_s: float = REGISTRY_PROBE_TIMEOUT_S
) -> None:
    """With ``codec.framing = confluent``: raise :class:`UserError` unless the schema registry
    at ``codec.schema_registry_url`` answers (a ``mock://`` registry is in-process: skipped).

    Args:
        codec: the codec settings (URL and ``schema_registry_extra``).
        timeout_s: HTTP timeout of the probe (one try, no retries).

    Example::

        require_schema_registry(settings.codec)
    """
    url = codec.schema_registry_url
    if codec.framing is not Framing.CONFLUENT or url is None or url.startswith("mock://"):
        return
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    shown = mask_url(url)
    conf = {**codec.schema_registry_extra, "url": url, "timeout": timeout_s, "max.retries": 0}
    try:
        SchemaRegistryClient(conf).get_subjects()
    except SchemaRegistryError as error:
        raise UserError(
            f"schema registry at {shown} (codec.schema_registry_url) answered HTTP "
            f"{error.http_status_code}: {error.error_message} (credentials and TLS go in "
            "codec.schema_registry_extra)"
        ) from error
    except Exception as error:  # the HTTP client's transport errors (httpx or httpx2), bad URLs
        text = str(error).strip()
        reason = f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__
        raise UserError(
            f"schema registry unreachable at {shown} (codec.schema_registry_url): {reason} "
            f"(probe timeout {timeout_s:g}s)"
        ) from error


def require_builtin_model(settings: Settings) -> OutputContract:
    """Raise :class:`UserError` for what only a configured model reads (``[events]``,
    ``[features]``, a configured model's retrieval keys) or any mistake in ``[output]``, when
    the built-in model is served (no ``[model.module]``).

    Args:
        settings: the command's settings.

    Returns:
        The built-in model's output contract as the checks resolved it (for the serving path:
        ``serve(output=...)``).

    Example::

        output = require_builtin_model(settings)
    """
    if settings.events.configured or settings.features.configured:
        raise UserError(
            "[events] and [features] map the input of a configured model: set "
            "[model.module] (the built-in model reads UserEvent and its own features)"
        )
    retrieval = settings.retrieval
    configured_only = [f"retrieval.{n}" for n in ("query", "items") if getattr(retrieval, n)]
    if retrieval.catalogue is CatalogueSource.TABLE:
        configured_only.append('retrieval.catalogue = "table"')
    if configured_only:
        raise UserError(
            f"{', '.join(configured_only)}: a configured model's retrieval ([model.module]); "
            "the built-in model queries with retrieval.query_features and lists its items "
            'with catalogue = "redis" or "file"'
        )
    from pipeline.models.output import resolve_output

    try:
        return resolve_output(settings)
    except ValueError as error:  # OutputContractError: one line naming the key
        raise UserError(str(error)) from error


def require_configured_model(
    settings: Settings, checkpoint: Path | None = None
) -> ConfiguredModel | None:
    """Raise :class:`UserError` for any mistake in ``[model.module]``, ``[events]``,
    ``[features]`` or ``[output]`` (:mod:`pipeline.models.preflight`,
    :mod:`pipeline.models.output`), and, given the ``checkpoint`` to serve, for a version
    imported for another module; without ``[model.module]``, the built-in model's checks
    (:func:`require_builtin_model`).

    ``[events]`` or ``[features]`` without ``[model.module]`` is a mistake too: the built-in
    model reads the built-in schema and features.

    Args:
        settings: the command's settings.
        checkpoint: the version to serve, if any.

    Returns:
        The configured model as the checks resolved it (for the serving path); ``None`` for
        the built-in model.

    Example::

        configured = require_configured_model(settings)
    """
    if settings.model.module is None:
        require_builtin_model(settings)
        return None
    from pipeline.models.preflight import check_configured_model  # torch: only then

    try:
        return check_configured_model(settings, checkpoint)
    except ValueError as error:  # ModelConfigError, FeatureMapError: one line naming the key
        raise UserError(str(error)) from error


def require_module_version(
    settings: Settings, checkpoint: Path, configured: ConfiguredModel | None = None
) -> CheckedVersion:
    """Raise :class:`UserError` unless ``checkpoint`` is a version imported for
    ``[model.module]``'s architecture (a new architecture needs its weights imported again).

    Args:
        settings: the command's settings (``[model.module]`` set).
        checkpoint: the version to serve.
        configured: ``[model.module]`` as :func:`require_configured_model` resolved it
            (default: resolved here).

    Returns:
        The version, checked (handed on in :attr:`ConfiguredModel.checked`: the loader
        and the scorer do not check it again).

    Example::

        require_module_version(settings, served, require_configured_model(settings))
    """
    from model.module.store import check_version, is_module_version
    from pipeline.models.preflight import configured_module

    if not is_module_version(checkpoint):
        raise UserError(
            f"{checkpoint} (model.checkpoint) is not a version of [model.module]: import the "
            "module's weights with `streamrank model import STATE_DICT_FILE --promote`"
        )
    try:
        config = configured.module if configured else configured_module(settings)[0]
        return check_version(config, checkpoint)
    except ValueError as error:
        raise UserError(str(error)) from error
