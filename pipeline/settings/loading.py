"""Configuration: one TOML file plus ``STREAMRANK_<SECTION>__<KEY>`` environment overrides.

Precedence (highest first): environment variables, the TOML file, the defaults below.
The TOML file is ``--config PATH`` on the CLI, else ``$STREAMRANK_CONFIG``, else
``streamrank.toml`` in the working directory when it exists.

Example ``streamrank.toml``::

    [kafka]
    bootstrap_servers = "broker-1:9092,broker-2:9092"
    security_protocol = "SASL_SSL"
    sasl_mechanism = "PLAIN"
    sasl_username = "svc-ranker"
    sasl_password = "..."          # never logged (SecretStr)
    [kafka.consumer_extra]         # any librdkafka consumer property, passed through as is
    "fetch.min.bytes" = "65536"

    [batching]
    max_batch_rows = 4096
    max_delay_ms = 20

Environment example: ``STREAMRANK_TOPICS__INPUT=events-v2``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from model.store.versions import is_versions_dir
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.codec import CodecSettings
from pipeline.settings.delivery import DeliverySettings, ShutdownSettings
from pipeline.settings.events import EventSettings
from pipeline.settings.features import FeatureSettings
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.metrics import MetricsSettings
from pipeline.settings.model import ModelSettings
from pipeline.settings.output import OutputSettings
from pipeline.settings.redis import RedisSettings
from pipeline.settings.retrieval import ModelSwapSettings, RetrievalSettings
from pipeline.settings.topics import RECORD_OVERHEAD_BYTES, TopicsSettings

ENV_PREFIX = "STREAMRANK_"
ENV_NESTED_DELIMITER = "__"
CONFIG_ENV_VAR = "STREAMRANK_CONFIG"
DEFAULT_CONFIG_FILE = Path("streamrank.toml")


class ConfigError(Exception):
    """A configuration the user has to fix: an unknown setting, a missing config file."""


class ConfigFileNotFoundError(ConfigError, FileNotFoundError):
    """The config file named by ``--config`` or ``$STREAMRANK_CONFIG`` does not exist."""


class Settings(BaseSettings):
    """All of streamrank's configuration, frozen once loaded. See the module docstring for
    sources; :func:`load_settings` reads the file, ``Settings(...)`` only the environment."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
        toml_file=None,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    topics: TopicsSettings = Field(default_factory=TopicsSettings)
    codec: CodecSettings = Field(default_factory=CodecSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    batching: BatchingSettings = Field(default_factory=BatchingSettings)
    model: ModelSettings = Field(default_factory=ModelSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    shutdown: ShutdownSettings = Field(default_factory=ShutdownSettings)
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    model_swap: ModelSwapSettings = Field(default_factory=ModelSwapSettings)
    events: EventSettings = Field(default_factory=EventSettings)
    features: FeatureSettings = Field(default_factory=FeatureSettings)
    output: OutputSettings = Field(default_factory=OutputSettings)
    synthetic: dict[str, Any] = Field(default_factory=dict)
    """``[synthetic]``, the tools' section (``seed-features``, ``produce``, ``init-model``):
    kept as written and validated only by the tools that read it
    (:class:`pipeline.tools.synthetic_settings.SyntheticSettings`)."""

    @field_validator("synthetic", mode="before")
    @classmethod
    def _tool_section(cls, value: Any) -> Any:
        return value.model_dump() if isinstance(value, BaseModel) else value

    @model_validator(mode="after")
    def _input_topic_holds_the_largest_event(self) -> Settings:
        """The input topic takes a value just over ``codec.max_message_bytes`` (to dead-letter
        it): ``topics.input_max_message_bytes`` leaves room for it and its framing."""
        least = self.codec.max_message_bytes + RECORD_OVERHEAD_BYTES
        if self.topics.input_max_message_bytes < least:
            raise ValueError(
                f"topics.input_max_message_bytes = {self.topics.input_max_message_bytes} is "
                f"less than codec.max_message_bytes + {RECORD_OVERHEAD_BYTES} = {least}: raise it "
                "(the input topic's max.message.bytes) or lower codec.max_message_bytes"
            )
        return self

    @model_validator(mode="after")
    def _ingest_workers_serve_one_version(self) -> Settings:
        """Refuse ingest workers where the job would follow a versions directory it cannot swap
        with workers (one line, for the CLI).

        With ingest workers the scorer lives in the scoring process and the model input is built
        in K other processes. The scoring process swaps a configured model's versions between
        two forwards (its input is laid out by the configuration, the same for every version of
        the architecture). The built-in model's versions carry the feature spec the workers lay
        their input out with (table sizes), and a retrieval index lives in every worker: no swap
        step spans them. So ``batching.ingest_workers > 0`` with ``model_swap.enabled`` and
        ``model.checkpoint`` a versions directory is refused serving the built-in model or with
        ``[retrieval]`` on.
        """
        root = self.model.checkpoint
        workers = self.batching.ingest_workers
        if not (workers and self.model_swap.enabled and is_versions_dir(root)):
            return self
        if self.model.module is None or self.retrieval.enabled:
            what = "the built-in model" if self.model.module is None else "retrieval"
            raise ValueError(
                f"batching.ingest_workers = {workers} cannot follow the model versions of {root} "
                f"with {what} (a live model swap needs ingest_workers = 0): set "
                "model_swap.enabled = false to serve its current version, or ingest_workers = 0"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env = _KnownNamesEnvSettingsSource(settings_cls)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env]
        toml_file = settings_cls.model_config.get("toml_file")
        if toml_file is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
        return tuple(sources)


def picklable(settings: Settings, **replaced: Any) -> Settings:
    """``settings`` as a plain :class:`Settings`, which pickles into another process
    (:func:`load_settings` builds a subclass per config file, which does not); the loaded
    sections, nothing read again, with ``replaced`` sections put in their place.

    Example::

        pickle.dumps(picklable(load_settings(Path("streamrank.toml"))))
    """
    sections = {name: getattr(settings, name) for name in Settings.model_fields}
    return Settings.model_construct(**{**sections, **replaced})


def unknown_env_settings(environ: Mapping[str, str]) -> list[str]:
    """``STREAMRANK_*`` variables that have the shape of a setting but name none.

    A variable is read as a setting when it uses the nested delimiter
    (``STREAMRANK_TOPICS__INPUT``) or names a whole section (``STREAMRANK_KAFKA``); other
    ``STREAMRANK_*`` variables (``STREAMRANK_CONFIG``, ``STREAMRANK_STACK_DIR`` of the scripts)
    are not settings and are left alone. Names are case-insensitive, as pydantic-settings reads
    them.

    Args:
        environ: the environment to check, e.g. ``os.environ``.

    Returns:
        The offending variable names, sorted.

    Example::

        unknown_env_settings({"STREAMRANK_TOPIC__INPUT": "x"})  # ["STREAMRANK_TOPIC__INPUT"]
    """
    sections = Settings.model_fields
    unknown = []
    for name in environ:
        if not name.upper().startswith(ENV_PREFIX):
            continue
        section, nested, rest = name[len(ENV_PREFIX) :].lower().partition(ENV_NESTED_DELIMITER)
        if not nested and section not in sections:
            continue  # not a setting: a variable of the scripts or of the CLI
        if section not in sections:
            unknown.append(name)
            continue
        model = sections[section].annotation
        key = rest.partition(ENV_NESTED_DELIMITER)[0]
        if nested and isinstance(model, type) and key not in model.model_fields:
            unknown.append(name)
    return sorted(unknown)


class _KnownNamesEnvSettingsSource(EnvSettingsSource):
    """The environment source, refusing ``STREAMRANK_*`` variables that name no setting."""

    def __call__(self) -> dict[str, Any]:
        unknown = unknown_env_settings(os.environ)
        if unknown:
            raise ConfigError(
                f"unknown config key in the environment: {', '.join(unknown)} "
                f"(settings are {ENV_PREFIX}<SECTION>{ENV_NESTED_DELIMITER}<KEY>, sections: "
                f"{', '.join(Settings.model_fields)})"
            )
        return super().__call__()


def _config_file() -> Path | None:
    """``$STREAMRANK_CONFIG``, else ``./streamrank.toml`` when it exists."""
    from_env = os.environ.get(CONFIG_ENV_VAR)
    if from_env:
        return Path(from_env)
    return DEFAULT_CONFIG_FILE if DEFAULT_CONFIG_FILE.exists() else None


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Load settings from ``config_file`` (or the default locations) and the environment.

    Args:
        config_file: a TOML file; it must exist when given.
        overrides: section objects or dicts that win over every other source (tests use this).

    Returns:
        The validated, frozen :class:`Settings`.

    Raises:
        ConfigFileNotFoundError: ``config_file`` (or ``$STREAMRANK_CONFIG``) does not exist.
        ConfigError: a ``STREAMRANK_*`` environment variable names no setting, or the file is
            not valid TOML.
        pydantic.ValidationError: an unknown key in the file, or a bad value anywhere.

    Example::

        settings = load_settings(Path("streamrank.toml"))
    """
    chosen = config_file or _config_file()
    if chosen is None:
        return Settings(**overrides)
    if not chosen.is_file():
        raise ConfigFileNotFoundError(f"config file not found: {chosen}")
    from_file = type(
        "Settings", (Settings,), {"model_config": {**Settings.model_config, "toml_file": chosen}}
    )
    try:
        return from_file(**overrides)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {chosen} is not valid TOML: {error}") from error
