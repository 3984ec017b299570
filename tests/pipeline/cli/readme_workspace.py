"""What the command smoke test needs: docs/commands.md's command table, and a workspace on the
real stack (a tiny trained model, its features in Redis, a config file)."""

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from model.store.checkpoint import save_checkpoint
from model.synthetic import SyntheticWorld
from model.synthetic.train import train_ranker
from pipeline.connectors.redis.feature_store import FeatureStoreWriter
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.loading import Settings
from pipeline.settings.topics import TopicsSettings
from pipeline.tools.synthetic_io import build_world, seed_world_features
from pipeline.tools.synthetic_settings import synthetic_settings
from tests.conftest import LocalStack
from tests.integration.conftest import TABLE_ROWS, WORLD

REPO_ROOT = Path(__file__).resolve().parents[3]
COMMANDS_PAGE = REPO_ROOT / "docs" / "commands.md"


def command_table() -> dict[str, set[str]]:
    """docs/commands.md's table: ``{"bench model": {"--batch-rows", "--json"}, ...}``."""
    commands: dict[str, set[str]] = {}
    for line in COMMANDS_PAGE.read_text().splitlines():
        match = re.match(r"^\| `streamrank ([^`]+)` \|", line)
        if match is None:
            continue
        words = match.group(1).split()
        first_argument = next(
            (i for i, w in enumerate(words) if w.startswith(("-", "[")) or w.isupper()), len(words)
        )  # options, or an argument in capitals (``model promote VERSION``)
        name = " ".join(words[:first_argument])
        commands[name] = set(re.findall(r"--[a-z][a-z0-9-]*", match.group(1)))
    return commands


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
    model, world = settings.model, synthetic_settings(settings)
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


def build_workspace(local_stack: LocalStack, directory: Path) -> Workspace:
    """A tiny trained model, its world's features in Redis, a config file naming both."""
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
    return Workspace(directory, settings, world, config_file)


def messages_in(settings: Settings, topic: str) -> int:
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


def bench_topics(settings: Settings) -> set[str]:
    admin = AdminClient(settings.kafka.config.admin)
    return {t for t in admin.list_topics(timeout=10).topics if t.startswith("bench-")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_prometheus(directory: Path) -> Iterator[str]:
    """Debian's Prometheus on a free port, scraping itself; yields its URL (skips without it)."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary (scripts/install_tools.sh installs it)")
    port = free_port()
    config = directory / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: self\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'tsdb'}",
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
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
