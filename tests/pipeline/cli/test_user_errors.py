"""Every user error: one line on stderr, exit code 2, no traceback (through the real CLI)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from model.store.versions import POINTER_FILE
from tests.conftest import REPO_ROOT, LocalStack
from tests.pipeline.cli.conftest import CliRunner


def _closed_loopback_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound once by us, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _assert_one_line_user_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    stderr = result.stderr
    assert result.returncode == 2, stderr[-2000:]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr[-2000:]
    assert lines[0].startswith("streamrank: error: ")
    assert "Traceback" not in stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def toml(tmp_path: Path) -> Path:
    path = tmp_path / "conf.toml"
    path.write_text('[topics]\ninput = "events"\n')
    return path


@pytest.mark.parametrize("before_command", [True, False])
def test_missing_config_file(run_cli: CliRunner, before_command: bool) -> None:
    args = (
        ["--config", "nope.toml", "consume"] if before_command else ["consume", "-c", "nope.toml"]
    )
    _assert_one_line_user_error(run_cli(*args), "config file not found", "nope.toml")


def test_missing_config_file_from_env_var(run_cli: CliRunner) -> None:
    result = run_cli("consume", env={"STREAMRANK_CONFIG": "gone.toml"})
    _assert_one_line_user_error(result, "config file not found", "gone.toml")


def test_unknown_key_in_config_file(run_cli: CliRunner, toml: Path) -> None:
    toml.write_text('[kafka]\nbootstrap_server = "b:9092"\n')
    result = run_cli("consume", "--config", str(toml))
    _assert_one_line_user_error(result, "unknown config key kafka.bootstrap_server")


def test_unknown_section_in_config_file(run_cli: CliRunner, toml: Path) -> None:
    toml.write_text("[batchin]\nmax_batch_rows = 8\n")
    result = run_cli("consume", "--config", str(toml))
    _assert_one_line_user_error(result, "unknown config key batchin")


def test_unknown_setting_in_environment(run_cli: CliRunner) -> None:
    result = run_cli("consume", env={"STREAMRANK_TOPIC__INPUT": "events"})
    _assert_one_line_user_error(result, "STREAMRANK_TOPIC__INPUT")


def test_bad_config_value_names_the_field(run_cli: CliRunner, toml: Path) -> None:
    toml.write_text("[batching]\nmax_batch_rows = 0\n")
    result = run_cli("consume", "--config", str(toml))
    _assert_one_line_user_error(result, "batching.max_batch_rows", "must be >= 1")


def test_settings_that_contradict_each_other_name_both(run_cli: CliRunner) -> None:
    result = run_cli("consume", env={"STREAMRANK_CODEC__MAX_MESSAGE_BYTES": "2000000"})
    _assert_one_line_user_error(
        result, "bad config: topics.input_max_message_bytes", "codec.max_message_bytes"
    )


def test_config_file_that_is_not_toml(run_cli: CliRunner, toml: Path) -> None:
    toml.write_text("[kafka\n")
    _assert_one_line_user_error(run_cli("consume", "-c", str(toml)), "not valid TOML")


def test_run_without_a_model(run_cli: CliRunner, tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    result = run_cli("run", env={"STREAMRANK_MODEL__CHECKPOINT": str(missing)})
    _assert_one_line_user_error(result, str(missing), "streamrank init-model")


def test_init_model_over_an_existing_checkpoint(run_cli: CliRunner, tmp_path: Path) -> None:
    existing = tmp_path / "model"
    existing.mkdir()
    result = run_cli("init-model", "--out", str(existing))
    _assert_one_line_user_error(result, "already exists", str(existing), "--overwrite")


def test_unreachable_kafka_broker(run_cli: CliRunner) -> None:
    broker = f"127.0.0.1:{_closed_loopback_port()}"
    result = run_cli("produce", "-n", "1", env={"STREAMRANK_KAFKA__BOOTSTRAP_SERVERS": broker})
    _assert_one_line_user_error(result, "Kafka broker unreachable", broker)


def test_unreachable_redis_hides_the_password(run_cli: CliRunner) -> None:
    url = f"redis://:hunter2@127.0.0.1:{_closed_loopback_port()}/0"
    result = run_cli("seed-features", env={"STREAMRANK_REDIS__URL": url})
    _assert_one_line_user_error(result, "Redis unreachable", "127.0.0.1")
    assert "hunter2" not in result.stderr


def test_missing_input_file(run_cli: CliRunner) -> None:
    _assert_one_line_user_error(run_cli("seed-features", "--users", "u.csv"), "--users", "u.csv")


def test_report_with_unreachable_prometheus(run_cli: CliRunner, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_closed_loopback_port()}"
    result = run_cli("report", "--out", str(tmp_path / "r"), "--prometheus", url)
    _assert_one_line_user_error(result, "cannot reach Prometheus", url)


def test_report_with_a_bad_duration(run_cli: CliRunner, tmp_path: Path) -> None:
    result = run_cli("report", "--out", str(tmp_path / "r"), "--since", "soon")
    _assert_one_line_user_error(result, "--since", "soon")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--loads", "half"], "--loads"),
        (["--loads", "0.5,0"], "(0, 2]"),
        (["--seconds", "0"], "--seconds"),
        (["--seconds", "2", "--warmup-seconds", "2"], "--warmup-seconds"),
        (["--plot", "/no/such/dir/l.png"], "/no/such/dir"),
        (["--compare", "old.json"], "--plot"),
        (["--capacity-only", "--plot", "l.png"], "--capacity-only"),
        (["--busy-cores", "-1"], "--busy-cores"),
        (["--busy-cores", "999"], "--busy-cores"),
    ],
)
def test_bench_latency_bad_options(run_cli: CliRunner, args: list[str], fragment: str) -> None:
    _assert_one_line_user_error(run_cli("bench", "latency", *args), fragment)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--workers", "one,two"], "--workers"),
        (["--workers", "0,-1"], "--workers must be >= 0"),
        (["--events", "0"], "--events"),
    ],
)
def test_bench_ingest_bad_options(run_cli: CliRunner, args: list[str], fragment: str) -> None:
    _assert_one_line_user_error(run_cli("bench", "ingest", *args), fragment)


def test_a_negative_number_of_ingest_workers(run_cli: CliRunner, toml: Path) -> None:
    toml.write_text("[batching]\ningest_workers = -1\n")
    result = run_cli("run", "--config", str(toml))
    _assert_one_line_user_error(result, "batching.ingest_workers", "must be >= 0")


def test_ingest_workers_refuse_to_follow_a_versions_directory(
    run_cli: CliRunner, toml: Path, tmp_path: Path
) -> None:
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / POINTER_FILE).write_text('{"version": "v1", "generation": 1}')
    toml.write_text(f'[batching]\ningest_workers = 2\n[model]\ncheckpoint = "{versions}"\n')
    result = run_cli("run", "--config", str(toml))
    _assert_one_line_user_error(
        result, "batching.ingest_workers = 2 cannot follow", "model_swap.enabled = false"
    )


def test_bench_latency_compare_with_a_file_that_is_not_a_report(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    (tmp_path / "old.json").write_text('{"capacity": 1}\n')
    result = run_cli("bench", "latency", "--plot", "l.png", "--compare", "old.json")
    _assert_one_line_user_error(result, "old.json", "bench latency --json")


def test_produce_waiting_for_a_group_that_never_joins(run_cli: CliRunner, local_stack) -> None:
    env = {"STREAMRANK_KAFKA__BOOTSTRAP_SERVERS": local_stack.bootstrap_servers}
    result = run_cli("produce", "-n", "1", "--wait-for-group", "--wait-timeout", "0.5", env=env)
    _assert_one_line_user_error(result, "did not own all partitions", "streamrank run")


@pytest.mark.parametrize(
    ("variable", "value", "key"),
    [("STREAMRANK_MODEL__QUANTIZE", "int8", "model.quantize"),
     ("STREAMRANK_MODEL__COMPILE", "true", "model.compile")],
)  # fmt: skip
def test_an_option_several_ranks_cannot_serve_is_refused_before_any_rank_starts(
    run_cli: CliRunner, variable: str, value: str, key: str
) -> None:
    result = run_cli("run", "--nproc", "2", env={variable: value})
    _assert_one_line_user_error(result, key, "--nproc 1")


def test_redis_url_without_a_scheme(run_cli: CliRunner) -> None:
    result = run_cli("seed-features", env={"STREAMRANK_REDIS__URL": "127.0.0.1:6379"})
    _assert_one_line_user_error(result, "redis.url", "127.0.0.1:6379", "redis://")


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("SECURITY_PROTOCOL", "sasl_ssl"),
        ("COMPRESSION_TYPE", "zstd"),
        ("AUTO_OFFSET_RESET", "earliest"),
    ],
)
def test_bad_kafka_client_value_is_rejected_at_start_up(
    run_cli: CliRunner, key: str, valid: str
) -> None:
    # The broker is unreachable on purpose: librdkafka's verdict comes before any connection.
    env = {
        f"STREAMRANK_KAFKA__{key}": "bogus",
        "STREAMRANK_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{_closed_loopback_port()}",
    }
    result = run_cli("consume", "--max", "1", env=env)
    _assert_one_line_user_error(result, f"kafka.{key.lower()}", "'bogus'", "valid:", valid)


@pytest.mark.parametrize("section", ["consumer_extra", "producer_extra"])
def test_unknown_librdkafka_property_in_extra(run_cli: CliRunner, toml: Path, section: str) -> None:
    toml.write_text(f'[kafka.{section}]\n"fetch.max.bites" = 1\n')
    result = run_cli("produce", "-n", "1", "--config", str(toml))
    _assert_one_line_user_error(result, f"kafka.{section}", "fetch.max.bites", "CONFIGURATION.md")


def test_bad_value_of_a_librdkafka_property_in_extra(run_cli: CliRunner, toml: Path) -> None:
    toml.write_text('[kafka.producer_extra]\n"linger.ms" = "soon"\n')
    result = run_cli("consume", "--config", str(toml))
    _assert_one_line_user_error(result, "kafka.producer_extra", "Invalid value")


def test_model_device_that_is_no_device(run_cli: CliRunner, tmp_path: Path) -> None:
    env = {"STREAMRANK_MODEL__DEVICE": "gpu", "STREAMRANK_MODEL__CHECKPOINT": str(tmp_path)}
    result = run_cli("run", env=env)
    _assert_one_line_user_error(result, "model.device", "'gpu'", "auto, cpu, cuda or cuda:N")


def test_model_device_cuda_without_cuda(run_cli: CliRunner) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run_cli("bench", "model", env={"STREAMRANK_MODEL__DEVICE": "cuda:0"})
    _assert_one_line_user_error(result, "model.device", "cuda:0", "no CUDA device", "auto or cpu")


def test_confluent_framing_without_a_registry(run_cli: CliRunner) -> None:
    result = run_cli("consume", env={"STREAMRANK_CODEC__FRAMING": "confluent"})
    _assert_one_line_user_error(result, "codec.schema_registry_url", 'framing = "raw"')


def test_unreachable_schema_registry(run_cli: CliRunner, local_stack: LocalStack) -> None:
    url = f"http://127.0.0.1:{_closed_loopback_port()}"
    env = {
        "STREAMRANK_KAFKA__BOOTSTRAP_SERVERS": local_stack.bootstrap_servers,
        "STREAMRANK_CODEC__FRAMING": "confluent",
        "STREAMRANK_CODEC__SCHEMA_REGISTRY_URL": url,
    }
    result = run_cli("consume", "--max", "1", env=env)
    _assert_one_line_user_error(
        result, "schema registry unreachable", url, "codec.schema_registry_url"
    )


@pytest.mark.parametrize(
    ("option", "header", "row", "missing"),
    [
        ("--users", "user_id,dense_0", "1,0.5", "dense_1"),
        ("--items", "item_id,dense_0,dense_1,dense_2,dense_3", "1,0,0,0,0", "category"),
    ],
)
def test_feature_file_lacking_a_column(
    run_cli: CliRunner, tmp_path: Path, option: str, header: str, row: str, missing: str
) -> None:
    csv = tmp_path / "features.csv"
    csv.write_text(f"{header}\n{row}\n")
    # Redis is unreachable: the file is checked before anything is written.
    env = {
        "STREAMRANK_MODEL__USER_DENSE_DIM": "4",
        "STREAMRANK_MODEL__ITEM_DENSE_DIM": "4",
        "STREAMRANK_REDIS__URL": f"redis://127.0.0.1:{_closed_loopback_port()}/0",
    }
    result = run_cli("seed-features", option, str(csv), env=env)
    _assert_one_line_user_error(result, option, str(csv), "missing column", missing)


def test_feature_file_with_text_in_a_number_column(run_cli: CliRunner, tmp_path: Path) -> None:
    csv = tmp_path / "users.csv"
    csv.write_text("user_id,dense_0\nu1,0.5\n")
    env = {"STREAMRANK_MODEL__USER_DENSE_DIM": "1"}
    result = run_cli("seed-features", "--users", str(csv), env=env)
    _assert_one_line_user_error(result, "--users", "column user_id is not numeric")


@pytest.mark.parametrize("endpoint", ["node0", "node0:", "node0:http", "node0:70000"])
def test_rdzv_endpoint_without_a_port(run_cli: CliRunner, endpoint: str) -> None:
    result = run_cli("run", "--nnodes", "2", "--rdzv-endpoint", endpoint)
    _assert_one_line_user_error(result, "--rdzv-endpoint", "HOST:PORT", repr(endpoint))


@pytest.mark.parametrize("before_command", [True, False])
def test_report_with_a_missing_config_file(
    run_cli: CliRunner, tmp_path: Path, before_command: bool
) -> None:
    out = ["--out", str(tmp_path / "r")]
    args = (
        ["--config", "nope.toml", "report", *out]
        if before_command
        else ["report", *out, "--config", "nope.toml"]
    )
    _assert_one_line_user_error(run_cli(*args), "config file not found", "nope.toml")


def test_report_with_a_bad_rate_window(run_cli: CliRunner, tmp_path: Path) -> None:
    result = run_cli("report", "--out", str(tmp_path / "r"), "--rate-window", "1 minute")
    _assert_one_line_user_error(result, "--rate-window", "1 minute")


_WITHOUT_TORCH = """
import sys
from pipeline.cli import app
try:
    app(sys.argv[1:], prog_name="streamrank")
except SystemExit as end:
    code = end.code
print("torch" in sys.modules, code, file=sys.stderr)
"""


@pytest.mark.parametrize(
    "command",
    [["run"], ["run", "--nproc", "2"], ["init-model"], ["plan"], ["produce"], ["bench", "latency"]],
    ids=" ".join,
)
def test_a_settings_mistake_is_reported_before_torch_is_imported(
    tmp_path: Path, command: list[str]
) -> None:
    """A user error costs a fraction of a second, not torch's import (seconds on 2 cores)."""
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, "--config", "nope.toml", *command],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        check=False,
    )
    lines = done.stderr.strip().splitlines()
    assert lines[0] == "streamrank: error: config file not found: nope.toml", done.stderr
    assert lines[-1] == "False 2", done.stderr
