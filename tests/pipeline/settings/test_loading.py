"""Settings: defaults, TOML file, STREAMRANK_* environment, librdkafka config mapping."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pydantic
import pytest
import redis
from pydantic import SecretStr

from model.store.versions import POINTER_FILE
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.codec import Framing
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.loading import (
    CONFIG_ENV_VAR,
    ConfigError,
    ConfigFileNotFoundError,
    Settings,
    load_settings,
    unknown_env_settings,
)
from pipeline.settings.model import ModelSettings
from pipeline.settings.redis import RedisSettings
from pipeline.settings.retrieval import ModelSwapSettings
from pipeline.settings.topics import TopicsSettings

SECRET = "hunter2-very-secret"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No STREAMRANK_* variables from the caller's shell, and no streamrank.toml in the cwd."""
    for name in list(os.environ):
        if name.startswith("STREAMRANK_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def _toml(tmp_path: Path, text: str, name: str = "conf.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


TOML = f"""
[kafka]
bootstrap_servers = "toml-broker:9092"
group_id = "toml-group"
sasl_password = "{SECRET}"
[kafka.consumer_extra]
"fetch.min.bytes" = "65536"

[topics]
input = "toml-events"
output = "toml-recs"

[redis]
url = "redis://toml-redis:6379/2"
cache_ttl_s = 12.5

[batching]
max_batch_rows = 128
max_delay_ms = 7

[codec]
framing = "confluent"
schema_registry_url = "http://registry:8081"
"""


def test_defaults() -> None:
    settings = load_settings()
    assert settings.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert settings.topics.input == "user-events"
    assert settings.redis.url == "redis://127.0.0.1:6379/0"
    assert settings.codec.framing is Framing.RAW
    assert settings.batching.max_batch_rows == 4096
    assert settings.kafka.sasl_password is None


def test_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRANK_TOPICS__INPUT", "events-v2")
    monkeypatch.setenv("STREAMRANK_KAFKA__BOOTSTRAP_SERVERS", "b1:9092,b2:9092")
    monkeypatch.setenv("STREAMRANK_REDIS__URL", "redis://env-redis:6380/1")
    monkeypatch.setenv("STREAMRANK_BATCHING__MAX_DELAY_MS", "3.5")
    monkeypatch.setenv("STREAMRANK_CODEC__FRAMING", "confluent")
    monkeypatch.setenv("STREAMRANK_CODEC__SCHEMA_REGISTRY_URL", "http://registry:8081")
    settings = load_settings()
    assert settings.topics.input == "events-v2"
    assert settings.topics.output == "recommendations"  # untouched sibling keeps its default
    assert settings.kafka.bootstrap_servers == "b1:9092,b2:9092"
    assert settings.redis.url == "redis://env-redis:6380/1"
    assert settings.batching.max_delay_ms == 3.5
    assert settings.codec.framing is Framing.CONFLUENT
    assert Settings().topics.input == "events-v2"


def test_env_dict_field_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRANK_KAFKA__CONSUMER_EXTRA", '{"fetch.min.bytes": "1024"}')
    settings = load_settings()
    assert settings.kafka.config.consumer["fetch.min.bytes"] == "1024"


def test_toml_file(tmp_path: Path) -> None:
    settings = load_settings(_toml(tmp_path, TOML))
    assert settings.kafka.bootstrap_servers == "toml-broker:9092"
    assert settings.kafka.group_id == "toml-group"
    assert settings.topics.input == "toml-events"
    assert settings.topics.dlq == "user-events-dlq"  # default where the file is silent
    assert settings.redis.url == "redis://toml-redis:6379/2"
    assert settings.redis.cache_ttl_s == 12.5
    assert settings.redis.retry_after_s == 1.0
    assert settings.batching.max_batch_rows == 128
    assert settings.codec.framing is Framing.CONFLUENT
    assert settings.codec.schema_registry_url == "http://registry:8081"
    assert isinstance(settings.kafka.sasl_password, SecretStr)
    assert settings.kafka.sasl_password.get_secret_value() == SECRET


def test_precedence_env_over_toml_over_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMRANK_TOPICS__INPUT", "env-events")
    monkeypatch.setenv("STREAMRANK_KAFKA__BOOTSTRAP_SERVERS", "env-broker:9092")
    monkeypatch.setenv("STREAMRANK_REDIS__URL", "redis://env-redis:6379/0")
    settings = load_settings(_toml(tmp_path, TOML))
    # env wins
    assert settings.topics.input == "env-events"
    assert settings.kafka.bootstrap_servers == "env-broker:9092"
    assert settings.redis.url == "redis://env-redis:6379/0"
    # toml wins over the default, also in the sections env touched
    assert settings.topics.output == "toml-recs"
    assert settings.kafka.group_id == "toml-group"
    assert settings.redis.cache_ttl_s == 12.5
    # default where neither says anything
    assert settings.topics.dlq == "user-events-dlq"
    assert settings.kafka.client_id == "streamrank"


def test_overrides_win_over_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRANK_TOPICS__INPUT", "env-events")
    settings = load_settings(_toml(tmp_path, TOML), topics=TopicsSettings(input="init-events"))
    assert settings.topics.input == "init-events"


def test_config_file_from_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV_VAR, str(_toml(tmp_path, TOML)))
    assert load_settings().topics.input == "toml-events"


def test_streamrank_toml_in_cwd_is_picked_up(tmp_path: Path) -> None:
    _toml(tmp_path, TOML, name="streamrank.toml")
    assert load_settings().topics.input == "toml-events"


def test_explicit_file_beats_env_var_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV_VAR, str(_toml(tmp_path, TOML)))
    other = _toml(tmp_path, '[topics]\ninput = "explicit"\n', name="other.toml")
    assert load_settings(other).topics.input == "explicit"


def test_missing_config_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "nope.toml")


def test_explicit_file_does_not_leak_into_later_loads(tmp_path: Path) -> None:
    assert load_settings(_toml(tmp_path, TOML)).topics.input == "toml-events"
    assert Settings().topics.input == "user-events"
    assert load_settings().topics.input == "user-events"


def test_explicit_file_reset_after_validation_error(tmp_path: Path) -> None:
    bad = _toml(tmp_path, "[batching]\nmax_batch_rows = 0\n")
    with pytest.raises(pydantic.ValidationError):
        load_settings(bad)
    assert Settings().batching.max_batch_rows == 4096


@pytest.mark.parametrize("field", ["max_batch_rows", "consume_batch_size", "max_in_flight_batches"])
def test_batching_positive_validation(field: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        BatchingSettings(**{field: 0})


def test_secret_not_in_repr_or_str(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from_toml = load_settings(_toml(tmp_path, TOML))
    monkeypatch.setenv("STREAMRANK_KAFKA__SASL_PASSWORD", SECRET)
    from_env = load_settings()
    for settings in (from_toml, from_env):
        assert isinstance(settings.kafka.sasl_password, SecretStr)
        assert settings.kafka.sasl_password.get_secret_value() == SECRET
        for text in (
            repr(settings),
            str(settings),
            repr(settings.kafka),
            str(settings.kafka),
            repr(settings.kafka.config),
            settings.model_dump_json(),
            str(settings.model_dump()),
        ):
            assert SECRET not in text


def test_consumer_config_maps_snake_case_to_dotted_keys() -> None:
    kafka = KafkaSettings(
        bootstrap_servers="b:9092",
        group_id="g",
        client_id="c",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="svc",
        sasl_password=SecretStr(SECRET),
        ssl_ca_location="/ca.pem",
        auto_offset_reset="latest",
        session_timeout_ms=6000,
        max_poll_interval_ms=120_000,
    )
    conf = kafka.config.consumer
    assert conf == {
        "bootstrap.servers": "b:9092",
        "client.id": "c",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "svc",
        "sasl.password": SECRET,  # librdkafka needs the real value
        "ssl.ca.location": "/ca.pem",
        "group.id": "g",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "latest",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
        "max.poll.interval.ms": 120_000,
        "partition.assignment.strategy": "cooperative-sticky",
    }
    # a tool's own group: tests/pipeline/connectors/kafka/test_clients.py


@pytest.mark.parametrize("heartbeat_ms", [0, 6000, 7000])
def test_a_heartbeat_not_below_the_session_timeout_is_refused(heartbeat_ms: int) -> None:
    with pytest.raises(pydantic.ValidationError, match="below session_timeout_ms \\(6000\\)"):
        KafkaSettings(session_timeout_ms=6000, heartbeat_interval_ms=heartbeat_ms)
    assert KafkaSettings(session_timeout_ms=6000).config.consumer["heartbeat.interval.ms"] == 1000


def test_client_configs_are_built_once_and_a_copy_with_changes_builds_its_own() -> None:
    kafka = KafkaSettings(group_id="g", producer_extra={"batch.size": 1})
    assert kafka.config is kafka.config
    assert kafka.config.admin == {"bootstrap.servers": "127.0.0.1:9092", "client.id": "streamrank"}
    copied = kafka.model_copy(update={"group_id": "bench", "producer_extra": {}})
    assert copied.config.consumer["group.id"] == "bench"
    assert "batch.size" not in copied.config.producer
    assert kafka.config.consumer["group.id"] == "g" and kafka.config.producer["batch.size"] == 1


def test_client_configs_repr_masks_secret_values() -> None:
    kafka = KafkaSettings(
        sasl_password=SecretStr(SECRET), producer_extra={"ssl.key.password": SECRET}
    )
    assert kafka.config.producer["sasl.password"] == SECRET  # librdkafka gets it
    assert kafka.config.producer["ssl.key.password"] == SECRET
    assert SECRET not in repr(kafka.config) and SECRET not in str(kafka.config)
    assert "'sasl.password': '***'" in repr(kafka.config)


def test_unset_optional_fields_are_left_out() -> None:
    conf = KafkaSettings().config.consumer
    for key in (
        "security.protocol",
        "sasl.mechanism",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
    ):
        assert key not in conf
    assert all(value is not None for value in conf.values())
    assert all("_" not in key for key in conf)


def test_consumer_extra_passes_through_and_wins() -> None:
    kafka = KafkaSettings(
        consumer_extra={
            "fetch.min.bytes": 65536,
            "auto.offset.reset": "latest",
            "session.timeout.ms": 45_000,
        }
    )
    conf = kafka.config.consumer
    assert conf["fetch.min.bytes"] == 65536
    assert conf["auto.offset.reset"] == "latest"
    assert conf["session.timeout.ms"] == 45_000
    assert conf["enable.auto.commit"] is False
    assert "fetch.min.bytes" not in kafka.config.producer


def test_only_extras_with_a_secret_name_are_hidden() -> None:
    kafka = KafkaSettings(
        consumer_extra={"debug": "cgrp", "sasl.oauthbearer.client.secret": "s3", "n": 5},
        producer_extra={"acks": "1", "ssl.key.password": "pw", "enable.idempotence": True},
    )
    shown = kafka.model_dump(mode="json")
    assert shown["consumer_extra"] == {
        "debug": "cgrp", "sasl.oauthbearer.client.secret": "**********", "n": 5
    }  # fmt: skip
    assert (
        shown["producer_extra"]["acks"] == "1"
        and shown["producer_extra"]["ssl.key.password"] != "pw"
    )
    assert kafka.config.consumer["sasl.oauthbearer.client.secret"] == "s3"  # librdkafka's
    assert kafka.config.producer["ssl.key.password"] == "pw"


def test_consumer_extra_from_toml(tmp_path: Path) -> None:
    conf = load_settings(_toml(tmp_path, TOML)).kafka.config.consumer
    assert conf["fetch.min.bytes"] == "65536"
    assert conf["bootstrap.servers"] == "toml-broker:9092"


def test_producer_config() -> None:
    kafka = KafkaSettings(
        linger_ms=9, compression_type="zstd", producer_extra={"acks": "1", "batch.size": 1}
    )
    conf = kafka.config.producer
    assert conf["enable.idempotence"] is True
    assert conf["linger.ms"] == 9
    assert conf["compression.type"] == "zstd"
    assert conf["acks"] == "1"  # producer_extra wins
    assert conf["batch.size"] == 1
    assert "group.id" not in conf
    assert "enable.auto.commit" not in conf
    assert KafkaSettings().config.producer["acks"] == "all"


# ------------------------------------------------------------------------------ [model] --

MODEL_TOML = """
[model]
quantize = "int8"
embedding_dim = 32
dense_arch = [64, 32]
num_embeddings = { user_id = 5000 }

[model.sharding]
default = "row_wise"
balance = "planner"
[model.sharding.tables.recent_items]
sharding_type = "column_wise"
compute_kernel = "fused"
ranks = [0, 1]
[model.sharding.tables.t_device]
sharding_type = "data_parallel"
"""


def test_model_sharding_table_from_toml(tmp_path: Path) -> None:
    from model.distributed.config import (
        Balance,
        ComputeKernel,
        ShardingConfig,
        ShardingKind,
        TableShardingConfig,
    )
    from model.options import QuantDtype

    model = load_settings(_toml(tmp_path, MODEL_TOML)).model
    assert model.quantize is QuantDtype.INT8
    assert model.sharding.config == ShardingConfig(
        default=TableShardingConfig(ShardingKind.ROW_WISE),
        per_table={
            "recent_items": TableShardingConfig(
                ShardingKind.COLUMN_WISE, ComputeKernel.FUSED, (0, 1)
            ),
            "t_device": TableShardingConfig(ShardingKind.DATA_PARALLEL),
        },
        balance=Balance.PLANNER,
    )


def test_model_sharding_defaults_and_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    from model.distributed.config import ShardingConfig, ShardingKind, TableShardingConfig

    assert Settings().model.sharding.config == ShardingConfig()
    monkeypatch.setenv("STREAMRANK_MODEL__SHARDING__DEFAULT", "row_wise")
    monkeypatch.setenv("STREAMRANK_MODEL__SHARDING__TABLES__ITEM_ID__SHARDING_TYPE", "column_wise")
    cfg = load_settings().model.sharding.config
    assert cfg.default == TableShardingConfig(ShardingKind.ROW_WISE)
    assert cfg.per_table == {"item_id": TableShardingConfig(ShardingKind.COLUMN_WISE)}


@pytest.mark.parametrize(
    "table",
    [
        'sharding_type = "diagonal_wise"',
        'sharding_type = "row_wise"\nranks = [0, 1]',
        'sharding_type = "data_parallel"\ncompute_kernel = "fused"',
        'sharding_type = "row_wise"\nkernel = "fused"',
    ],
)
def test_bad_model_sharding_tables_are_rejected_at_load(tmp_path: Path, table: str) -> None:
    text = f"[model.sharding.tables.item_id]\n{table}\n"
    with pytest.raises(pydantic.ValidationError):
        load_settings(_toml(tmp_path, text))


def test_model_rejects_the_string_dsl_and_unknown_quantize(tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError):
        load_settings(_toml(tmp_path, '[model]\nsharding = "table_wise,item_id=row_wise"\n'))
    with pytest.raises(pydantic.ValidationError):
        load_settings(_toml(tmp_path, '[model]\nquantize = "int3"\n'))


def test_model_feature_spec_from_settings(tmp_path: Path) -> None:
    from model.features.spec import SPEC_SETTING_KEYS, FeatureSpec, SparseFeature

    assert Settings().model.feature_spec() == FeatureSpec()
    spec = load_settings(_toml(tmp_path, MODEL_TOML)).model.feature_spec()
    assert spec.embedding_dim == 32 and spec.dense_arch == (64, 32)
    assert spec.table(SparseFeature.USER_ID).num_embeddings == 5000
    assert (
        spec.table(SparseFeature.ITEM_ID).num_embeddings == FeatureSpec().tables[1].num_embeddings
    )
    # Every spec setting is a [model] key, and the defaults are the spec's own.
    defaults = Settings().model.model_dump()
    assert set(SPEC_SETTING_KEYS) <= set(defaults)
    with pytest.raises(ValueError, match="unknown features"):
        load_settings(
            _toml(tmp_path, "[model]\nnum_embeddings = { nope = 3 }\n")
        ).model.feature_spec()


def test_unknown_key_in_toml_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="bogus"):
        load_settings(_toml(tmp_path, "[redis]\nbogus = 1\n"))


def test_unknown_setting_in_env_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRANK_REDIS__URLS", "redis://x:6379/0")
    with pytest.raises(ConfigError, match="STREAMRANK_REDIS__URLS"):
        load_settings()


def test_streamrank_variables_that_are_not_settings_are_left_alone() -> None:
    environ = {
        "STREAMRANK_CONFIG": "f.toml",
        "STREAMRANK_STACK_DIR": ".stack",
        "STREAMRANK_KAFKA_START_TIMEOUT": "90",
        "STREAMRANK_KAFKA": "{}",
        "STREAMRANK_KAFKA__CONSUMER_EXTRA__X": "1",
        "STREAMRANK_TOPICS__INPUT": "events",
        "streamrank_model__device": "cpu",
    }
    assert unknown_env_settings(environ) == []
    assert unknown_env_settings({"STREAMRANK_TOPIC__INPUT": "x", "STREAMRANK_METRICS__PORTS": "1"})


def test_missing_config_file_from_env_var_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV_VAR, "gone.toml")
    with pytest.raises(ConfigFileNotFoundError, match=r"gone\.toml"):
        load_settings()


def test_redis_tls_ca_reaches_the_client_only_for_a_tls_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert RedisSettings().client_kwargs() == {}
    assert RedisSettings(url="unix:///run/redis.sock").client_kwargs() == {}
    monkeypatch.setenv("STREAMRANK_REDIS__URL", "rediss://:pw@127.0.0.1:6380/0")
    monkeypatch.setenv("STREAMRANK_REDIS__SSL_CA_CERTS", "/stack/tls/ca.pem")
    redis_settings = load_settings().redis
    assert redis_settings.client_kwargs() == {
        "ssl_ca_certs": "/stack/tls/ca.pem",
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
    }
    with pytest.raises(pydantic.ValidationError, match="needs a TLS URL"):
        RedisSettings(url="redis://127.0.0.1:6379/0", ssl_ca_certs="/stack/tls/ca.pem")


def test_a_tls_redis_client_checks_the_certificate_and_the_host_name() -> None:
    """Set explicitly, not left to redis-py's defaults (redis-py 5 skipped the host name)."""
    settings = RedisSettings(url="rediss://:pw@127.0.0.1:6380/0")
    assert settings.client_kwargs() == {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    client = redis.Redis.from_url(settings.url, **settings.client_kwargs())
    connection = client.connection_pool.make_connection()  # built, not connected
    assert connection.check_hostname is True
    assert connection.cert_reqs == ssl.CERT_REQUIRED
    client.close()


@pytest.mark.parametrize(
    ("written", "value"), [('"auto"', None), ('"AUTO"', None), ("true", True), ("false", False)]
)
def test_overlap_forward_takes_auto(tmp_path: Path, written: str, value: bool | None) -> None:
    path = _toml(tmp_path, f"[batching]\noverlap_forward = {written}\n")
    assert load_settings(path).batching.overlap_forward is value


def test_overlap_forward_auto_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRANK_BATCHING__OVERLAP_FORWARD", "auto")
    assert load_settings().batching.overlap_forward is None


def test_overlap_forward_rejects_other_words() -> None:
    with pytest.raises(pydantic.ValidationError):
        BatchingSettings.model_validate({"overlap_forward": "sometimes"})


def test_confluent_framing_needs_a_registry_url(tmp_path: Path) -> None:
    path = _toml(tmp_path, '[codec]\nframing = "confluent"\n')
    with pytest.raises(pydantic.ValidationError, match=r"codec\.schema_registry_url"):
        load_settings(path)
    with_url = _toml(
        tmp_path, '[codec]\nframing = "confluent"\nschema_registry_url = "http://r:8081"\n'
    )
    assert load_settings(with_url).codec.framing is Framing.CONFLUENT


def test_ingest_workers_following_versions_are_refused_when_the_settings_load(
    tmp_path: Path,
) -> None:
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / POINTER_FILE).write_text('{"version": "v1", "generation": 1}')
    toml = tmp_path / "conf.toml"
    toml.write_text(f'[batching]\ningest_workers = 2\n[model]\ncheckpoint = "{versions}"\n')
    with pytest.raises(pydantic.ValidationError, match="ingest_workers = 2 cannot follow"):
        load_settings(toml)
    # its current version served alone, or a plain checkpoint directory: fine
    load_settings(toml, model_swap=ModelSwapSettings(enabled=False))
    load_settings(toml, model=ModelSettings(checkpoint=tmp_path / "model"))
