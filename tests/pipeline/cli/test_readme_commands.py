"""Every command of README's command table, run as a user runs it against the real stack.

Small sizes throughout (a tiny model, tens of events, fractions of a second of timing): each
command must finish and print what README says it prints, so none can silently break again.
The table itself is checked against the CLI (every command and option shown exists) and against
this file (every command has a smoke test here).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import typer.core
import typer.main
import typer.testing
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from model.checkpoint import load_meta, save_checkpoint
from model.synthetic import SyntheticWorld
from model.train import train_ranker
from pipeline.cli import app
from pipeline.config import KafkaSettings, Settings, TopicsSettings
from pipeline.feature_store import FeatureStoreWriter
from pipeline.kafka_io import ensure_topics, make_producer, produce
from pipeline.stages.decode import RECOMMENDATION_SCHEMA_FILE, RecordCodec
from pipeline.tools.bench.common import delete_topics
from pipeline.tools.synthetic_io import build_world, produce_events, seed_world_features
from tests.conftest import LocalStack
from tests.integration.conftest import TABLE_ROWS, WORLD

REPO_ROOT = Path(__file__).resolve().parents[3]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) \S+: ")

pytestmark = pytest.mark.timeout(600)


def readme_commands() -> dict[str, set[str]]:
    """README's command table: ``{"bench model": {"--batch-rows", "--json"}, ...}``."""
    commands: dict[str, set[str]] = {}
    for line in (REPO_ROOT / "README.md").read_text().splitlines():
        match = re.match(r"^\| `streamrank ([^`]+)` \|", line)
        if match is None:
            continue
        words = match.group(1).split()
        name = " ".join(
            w
            for w in words[
                : next((i for i, w in enumerate(words) if w.startswith(("-", "["))), len(words))
            ]
        )
        commands[name] = set(re.findall(r"--[a-z][a-z-]*", match.group(1)))
    return commands


def cli_commands() -> dict[str, typer.core.TyperCommand]:
    """Every command of the ``streamrank`` app, by its name (``"bench model"``)."""
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup)
    found: dict[str, typer.core.TyperCommand] = {}
    for name, command in root.commands.items():
        if isinstance(command, typer.core.TyperGroup):
            found.update({f"{name} {sub}": c for sub, c in command.commands.items()})
        else:
            found[name] = command
    return found


def _no_constant(name: str) -> None:
    raise ValueError(f"not strict JSON: {name}")


def strict_json(text: str) -> Any:
    """``text`` parsed as strict JSON (``NaN``/``Infinity`` are errors)."""
    return json.loads(text, parse_constant=_no_constant)


@dataclass
class Workspace:
    """A tiny model, its world's features in Redis and a config file naming them."""

    directory: Path
    settings: Settings
    world: SyntheticWorld
    config_file: Path

    def fresh(self, name: str) -> tuple[Settings, dict[str, str]]:
        """Settings on new topics and group, and the same as ``STREAMRANK_*`` overrides."""
        tag = f"{name}-{uuid.uuid4().hex[:8]}"
        topics = TopicsSettings(
            input=f"events-{tag}", output=f"recs-{tag}", dlq=f"dlq-{tag}", partitions=2
        )
        kafka = self.settings.kafka.model_copy(update={"group_id": f"group-{tag}"})
        settings = self.settings.model_copy(update={"topics": topics, "kafka": kafka})
        env = {
            "STREAMRANK_TOPICS__INPUT": topics.input,
            "STREAMRANK_TOPICS__OUTPUT": topics.output,
            "STREAMRANK_TOPICS__DLQ": topics.dlq,
            "STREAMRANK_TOPICS__PARTITIONS": "2",
            "STREAMRANK_KAFKA__GROUP_ID": kafka.group_id,
        }
        return settings, env

    def cli(
        self, *args: str, env: dict[str, str] | None = None, log_file: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``python -m pipeline.cli ARGS`` with the workspace's config; with ``log_file``,
        stdout and stderr both go to that file (as in ``streamrank run > log 2>&1``)."""
        clean = {k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")}
        python_path = os.pathsep.join(filter(None, [str(REPO_ROOT), clean.get("PYTHONPATH")]))
        full_env = {
            **clean,
            "PYTHONPATH": python_path,
            "STREAMRANK_CONFIG": str(self.config_file),
            **(env or {}),
        }
        command = [sys.executable, "-m", "pipeline.cli", *args]
        if log_file is None:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                cwd=self.directory,
                env=full_env,
                timeout=300,
                check=False,
            )
        else:
            with log_file.open("w") as out:
                result = subprocess.run(
                    command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                    cwd=self.directory,
                    env=full_env,
                    timeout=300,
                    check=False,
                )
        output = log_file.read_text() if log_file else result.stderr
        assert result.returncode == 0, f"{args}: {output[-3000:]}"
        return result


def _toml(settings: Settings) -> str:
    model, world = settings.model, settings.synthetic
    tables = "\n".join(f"{name} = {rows}" for name, rows in model.num_embeddings.items())
    return f"""
[kafka]
bootstrap_servers = "{settings.kafka.bootstrap_servers}"
group_id = "{settings.kafka.group_id}"
session_timeout_ms = 6000
[topics]
partitions = 2
[redis]
url = "{settings.redis.url}"
key_prefix = "{settings.redis.key_prefix}"
[batching]
max_batch_rows = 256
[metrics]
enabled = false
[model]
checkpoint = "{model.checkpoint}"
device = "cpu"
embedding_dim = {model.embedding_dim}
dense_arch = {model.dense_arch}
over_arch = {model.over_arch}
recent_items_cap = {model.recent_items_cap}
[model.num_embeddings]
{tables}
[synthetic]
num_users = {world.num_users}
num_items = {world.num_items}
num_categories = {world.num_categories}
seed = {world.seed}
min_candidates = {world.min_candidates}
max_candidates = {world.max_candidates}
"""


@pytest.fixture(scope="module")
def workspace(
    local_stack: LocalStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Workspace]:
    directory = tmp_path_factory.mktemp("readme")
    tag = uuid.uuid4().hex[:8]
    settings = Settings(
        kafka=KafkaSettings(
            bootstrap_servers=local_stack.bootstrap_servers, group_id=f"readme-{tag}"
        ),
        redis={"url": local_stack.redis_url, "key_prefix": f"readme-{tag}"},
        model={
            "checkpoint": directory / "model",
            "device": "cpu",
            "embedding_dim": 16,
            "num_embeddings": {f.value: n for f, n in TABLE_ROWS.items()},
            "dense_arch": [32, 16],
            "over_arch": [32, 1],
            "recent_items_cap": 8,
        },
        synthetic=WORLD,
    )
    world = build_world(settings)
    spec = settings.model.feature_spec()
    trained = train_ranker(spec, world, num_events=600, epochs=1, seed=0)
    save_checkpoint(trained.ranker, spec, settings.model.checkpoint, metrics={"auc": trained.auc})
    client = redis.Redis.from_url(local_stack.redis_url)
    seed_world_features(world, FeatureStoreWriter(client, settings.redis.key_prefix))
    client.close()
    config_file = directory / "streamrank.toml"
    config_file.write_text(_toml(settings))
    yield Workspace(directory, settings, world, config_file)


SMOKE: dict[str, Callable[[Workspace], None]] = {}


def smoke(name: str) -> Callable[[Callable[[Workspace], None]], Callable[[Workspace], None]]:
    def register(check: Callable[[Workspace], None]) -> Callable[[Workspace], None]:
        SMOKE[name] = check
        return check

    return register


def _messages_in(settings: Settings, topic: str) -> int:
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": "readme-count"}
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        total = 0
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            total += high - low
        return total
    finally:
        consumer.close()


def _bench_topics(settings: Settings) -> set[str]:
    admin = AdminClient(settings.kafka.admin_config())
    return {t for t in admin.list_topics(timeout=10).topics if t.startswith("bench-")}


@smoke("run")
def check_run(ws: Workspace) -> None:
    settings, env = ws.fresh("run")
    ensure_topics(settings.kafka, settings.topics)
    produce_events(settings, ws.world, 40, malformed=3)
    log, summary_file = ws.directory / "run.log", ws.directory / "run-summary.json"
    ws.cli(
        "run",
        "--exit-when-idle",
        "2",
        "--summary-json",
        str(summary_file),
        env=env,
        log_file=log,
    )
    lines = log.read_text().splitlines()
    # `tail -n 1` of the log is the summary, strict JSON; every line before is one record.
    summary = strict_json(lines[-1])
    assert summary["events_out"] == 40 and summary["dead_lettered"] == 3, summary
    assert isinstance(summary["latency_p99_ms"], float)
    assert strict_json(summary_file.read_text()) == summary
    assert all(LOG_LINE.match(line) for line in lines[:-1]), lines[:-1]
    assert "is_fx_tracing" not in log.read_text()

    # With no input at all, and JSON logs: every line an object, null latencies (not NaN).
    _, idle_env = ws.fresh("run-idle")
    json_log = ws.directory / "run-json.log"
    ws.cli("--log-format", "json", "run", "--exit-when-idle", "1", env=idle_env, log_file=json_log)
    records = [strict_json(line) for line in json_log.read_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records[:-1])
    assert records[-1]["events_out"] == 0 and records[-1]["latency_p50_ms"] is None


@smoke("plan")
def check_plan(ws: Workspace) -> None:
    # --json is tested in test_plan.py; here the table, for GPUs (planning runs nothing).
    text = ws.cli("plan", "--nproc", "2", "--device", "cuda").stdout
    assert "sharding plan for 2 rank(s)" in text
    assert "rank 0:" in text and "rank 1:" in text


@smoke("produce")
def check_produce(ws: Workspace) -> None:
    settings, env = ws.fresh("produce")
    result = ws.cli("produce", "--events", "20", "--malformed", "2", "--seed", "3", env=env)
    assert f"produced 20 events and 2 malformed messages to {settings.topics.input}" in (
        result.stderr
    )
    assert _messages_in(settings, settings.topics.input) == 22


@smoke("consume")
def check_consume(ws: Workspace) -> None:
    settings, env = ws.fresh("consume")
    ensure_topics(settings.kafka, settings.topics)
    codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, settings.topics.output)
    producer = make_producer(settings.kafka)
    for n in range(3):
        record = {
            "event_id": f"event-{n}",
            "user_id": n,
            "items": [{"item_id": 7, "score": 0.5}],
            "model_version": "m-1",
            "scored_at": int(time.time() * 1000),
            "fallback_features": [],
        }
        produce(producer, settings.topics.output, codec.encode(record))
    assert producer.flush(30) == 0
    out = ws.cli("consume", "--max", "3", "--timeout", "20", env=env).stdout.splitlines()
    assert sorted(strict_json(line)["event_id"] for line in out) == [
        "event-0",
        "event-1",
        "event-2",
    ]


@smoke("seed-features")
def check_seed_features(ws: Workspace) -> None:
    world = ws.settings.synthetic
    result = ws.cli("seed-features")
    assert f"seeded {world.num_users} users and {world.num_items} items from synthetic world" in (
        result.stderr
    )
    dense = ",".join(f"dense_{k}" for k in range(ws.settings.model.user_dense_dim))
    values = ",".join("0.5" for _ in range(ws.settings.model.user_dense_dim))
    item_dense = ",".join(f"dense_{k}" for k in range(ws.settings.model.item_dense_dim))
    item_values = ",".join("0.25" for _ in range(ws.settings.model.item_dense_dim))
    users, items = ws.directory / "users.csv", ws.directory / "items.csv"
    users.write_text(f"user_id,{dense},recent\n9000001,{values},5 6\n9000002,{values},\n")
    items.write_text(f"item_id,category,{item_dense}\n9000003,4,{item_values}\n")
    result = ws.cli("seed-features", "--users", str(users), "--items", str(items))
    assert "seeded 2 users and 1 items from files" in result.stderr
    client = redis.Redis.from_url(ws.settings.redis.url)
    prefix = ws.settings.redis.key_prefix
    assert client.exists(f"{prefix}:u:9000001", f"{prefix}:i:9000003") == 2
    client.close()


@smoke("init-model")
def check_init_model(ws: Workspace) -> None:
    out = ws.directory / "new-model"
    result = ws.cli(
        "init-model", "--events", "300", "--epochs", "1", "--seed", "1", "--out", str(out)
    )
    meta = load_meta(out)
    assert f"saved {meta.model_version} to {out}" in result.stderr
    assert "held-out AUC" in result.stderr


@smoke("bench model")
def check_bench_model(ws: Workspace) -> None:
    result = ws.cli("bench", "model", "--batch-rows", "64", "--seconds", "0.2", "--json")
    report = strict_json(result.stdout.splitlines()[-1])
    assert report["model_version"] == load_meta(ws.settings.model.checkpoint).model_version
    assert report["rows_per_s"] > 0


@smoke("bench pipeline")
def check_bench_pipeline(ws: Workspace) -> None:
    before = _bench_topics(ws.settings)
    result = ws.cli(
        "bench",
        "pipeline",
        "--events",
        "30",
        "--per-event-events",
        "5",
        "--rounds",
        "1",
        "--model-seconds",
        "0.2",
        "--json",
    )
    report = strict_json(result.stdout.splitlines()[-1])
    assert report["rounds"] == 1 and len(report["e2e_over_bare"]) == 1
    assert report["e2e_rows_per_s"] > 0 and report["per_event_rows_per_s"] > 0
    deleted = re.search(r"deleted the benchmark's topics: (.+)$", result.stderr, re.MULTILINE)
    assert deleted is not None and len(deleted.group(1).split(", ")) == 6  # 2 runs x 3 topics
    deadline = time.monotonic() + 60  # until the deletion reaches the broker's metadata
    while _bench_topics(ws.settings) - before:
        assert time.monotonic() < deadline, _bench_topics(ws.settings) - before
        time.sleep(0.2)


def _bench_ranks(ws: Workspace, nproc: str) -> Any:
    result = ws.cli(
        "bench",
        "ranks",
        "--events",
        "20",
        "--rounds",
        "1",
        "--nproc",
        nproc,
        "--keep-topics",
        "--json",
    )
    kept = re.search(r"keeping the benchmark's topics: (.+)$", result.stderr, re.MULTILINE)
    assert kept is not None
    names = kept.group(1).split(", ")
    assert len(names) == 3 * len(nproc.split(",")) and set(names) <= _bench_topics(ws.settings)
    assert delete_topics(ws.settings, names) == names
    return strict_json(result.stdout.splitlines()[-1])


@smoke("bench ranks")
def check_bench_ranks(ws: Workspace) -> None:
    # One rank is one process (quick); test_bench_ranks_over_two_ranks runs torchrun.
    report = _bench_ranks(ws, "1")
    assert report["rows_per_s"]["1"][0] > 0


@pytest.mark.slow
def test_bench_ranks_over_two_ranks(workspace: Workspace) -> None:
    report = _bench_ranks(workspace, "2")
    assert len(report["rank_steps"]["2"][0]) == 2  # both ranks reported
    assert report["rows_per_s"]["2"][0] > 0


@smoke("bench quantize")
def check_bench_quantize(ws: Workspace) -> None:
    result = ws.cli("bench", "quantize", "--batch-rows", "64", "--seconds", "0.1", "--json")
    report = strict_json(result.stdout.splitlines()[-1])
    dtypes = [q["dtype"] for q in report["quantization"]]
    assert dtypes == ["fp16", "int8"]


@smoke("bench compile")
def check_bench_compile(ws: Workspace) -> None:
    result = ws.cli(
        "bench", "compile", "--batch-rows", "64", "--seconds", "0.1", "--rounds", "1", "--json"
    )
    report = strict_json(result.stdout.splitlines()[-1])
    assert len(report["compiled_rows_per_s"]) == 1
    assert report["max_abs_score_diff"] < 1e-4


@smoke("bench overhead")
def check_bench_overhead(ws: Workspace) -> None:
    result = ws.cli("bench", "overhead", "--events", "50", "--json")
    report = strict_json(result.stdout.splitlines()[-1])
    assert report["events"] == 50 and report["passthrough_eps"] > 0
    assert {"decode", "forward", "produce"} <= report["stages_us"].keys()


@smoke("bench codec")
def check_bench_codec(ws: Workspace) -> None:
    # Without --json: one "dotted.key: JSON value" line per figure on stdout.
    result = ws.cli("bench", "codec", "--events", "70", "--rounds", "1")
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert json.loads(lines["events"]) == 70
    assert len(json.loads(lines["us_per_event.decode_columnar"])) == 1
    assert json.loads(lines["decode_speedup"]) > 0


@smoke("bench precision")
def check_bench_precision(ws: Workspace) -> None:
    result = ws.cli(
        "bench", "precision", "--batch-rows", "64", "--seconds", "0.1", "--rounds", "1", "--json"
    )
    report = strict_json(result.stdout.splitlines()[-1])
    assert set(report["variants"]) == {"fp32", "tf32", "bf16"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@smoke("report")
def check_report(ws: Workspace) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary (scripts/install_tools.sh installs it)")
    port = _free_port()
    config = ws.directory / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: self\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={ws.directory / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2)
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "prometheus not ready"
                time.sleep(0.3)
        out = ws.directory / "report"
        result = ws.cli(
            "report",
            "--out",
            str(out),
            "--prometheus",
            url,
            "--since",
            "1m",
            "--rate-window",
            "30s",
        )
    finally:
        proc.terminate()
        proc.wait(30)
    names = ["throughput.png", "latency.png", "dlq.png", "batch_rows.png"]
    assert all((out / name).read_bytes().startswith(PNG_MAGIC) for name in names)
    assert result.stderr.count("wrote ") == 4


def test_readme_table_lists_every_command_and_each_has_a_smoke_test() -> None:
    readme, cli = readme_commands(), cli_commands()
    assert set(readme) == set(cli), "README's command table and the CLI disagree"
    assert set(SMOKE) == set(cli), "a command without a smoke test here"
    for name, options in readme.items():
        known = {opt for param in cli[name].params for opt in param.opts}
        assert options <= known, f"README shows {options - known} for `streamrank {name}`"


@pytest.mark.parametrize("name", sorted(cli_commands()))
def test_help_of_every_command(name: str) -> None:
    result = typer.testing.CliRunner().invoke(app, [*name.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "--config" in result.output


_SLOW = {"bench compile": "torch.compile (inductor) takes a minute on a busy 2-core machine"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[pytest.mark.slow] if name in _SLOW else [])
        for name in sorted(SMOKE)
    ],
)
def test_readme_command(name: str, workspace: Workspace) -> None:
    SMOKE[name](workspace)
