"""Shared fixtures: the real local stack (Kafka + Redis) and factories over it.

The session starts its own stack in a temp dir with ``scripts/stack_up.sh`` (the same script
``make stack-up`` uses) and stops it at the end. Integration tests get unique topics, consumer
groups and Redis key prefixes from the factories, so they never see each other's data.

Nothing is left behind: every process the session starts carries the session's marker in its
environment (tests/processes.py), and a session that ends with any of them still alive fails
(after listing and killing them).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, Producer

from pipeline.connectors.kafka.clients import ensure_topics
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.loading import Settings
from pipeline.settings.metrics import MetricsSettings
from pipeline.settings.redis import RedisSettings
from pipeline.settings.topics import TopicsSettings
from tests.processes import SESSION_ENV, describe, kill_marked, leftovers, mark_session

LEFTOVER_GRACE_ENV = "STREAMRANK_TEST_LEFTOVER_GRACE_S"
"""How long the session's end waits for processes being stopped to exit (default 15 s)."""

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class LocalStack:
    """Where the session's Kafka and Redis listen."""

    bootstrap_servers: str
    redis_url: str
    directory: Path


def _read_env(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            env[key] = value.strip().strip("'\"")
    return env


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    directory = tmp_path_factory.mktemp("stack")
    subprocess.run(
        [str(REPO_ROOT / "scripts" / "stack_up.sh"), str(directory)],
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=600,
    )
    env = _read_env(directory / "env")
    try:
        yield LocalStack(
            env["STREAMRANK_KAFKA__BOOTSTRAP_SERVERS"], env["STREAMRANK_REDIS__URL"], directory
        )
    finally:
        stack_down(directory)


def stack_down(directory: Path) -> None:
    """``scripts/stack_down.sh``: stop the stack of ``directory`` (its servers, by pid)."""
    subprocess.run(
        [str(REPO_ROOT / "scripts" / "stack_down.sh"), str(directory)],
        check=False,
        stdout=subprocess.DEVNULL,
        timeout=120,
    )


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique_name("events")`` -> ``events-<test name>-<random>`` (valid topic/group name)."""

    def make(prefix: str) -> str:
        test = "".join(c if c.isalnum() else "-" for c in request.node.name)[:40]
        return f"{prefix}-{test}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture
def settings_factory(
    local_stack: LocalStack, unique_name: Callable[[str], str]
) -> Callable[..., Settings]:
    """Settings pointing at the local stack, with fresh topics, group and Redis prefix.

    Keyword arguments replace whole sections, e.g. ``settings_factory(batching=BatchingSettings(
    max_batch_rows=64))``.
    """

    def make(**sections: Any) -> Settings:
        base: dict[str, Any] = {
            "kafka": KafkaSettings(
                bootstrap_servers=local_stack.bootstrap_servers,
                group_id=unique_name("group"),
                session_timeout_ms=6000,
            ),
            "topics": TopicsSettings(
                input=unique_name("events"),
                output=unique_name("recs"),
                dlq=unique_name("dlq"),
                partitions=4,
            ),
            "redis": RedisSettings(url=local_stack.redis_url, key_prefix=unique_name("sr")),
            "batching": BatchingSettings(max_batch_rows=512, max_delay_ms=20),
            "metrics": MetricsSettings(enabled=False),
        }
        base.update(sections)
        settings = Settings(**base)
        ensure_topics(settings.kafka.config, settings.topics)
        return settings

    return make


@pytest.fixture
def producer_factory(local_stack: LocalStack) -> Iterator[Callable[..., Producer]]:
    made: list[Producer] = []

    def make(**extra: Any) -> Producer:
        producer = Producer({"bootstrap.servers": local_stack.bootstrap_servers, **extra})
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.flush(10)


@pytest.fixture
def consumer_factory(
    local_stack: LocalStack, unique_name: Callable[[str], str]
) -> Iterator[Callable[..., Consumer]]:
    made: list[Consumer] = []

    def make(*topics: str, **extra: Any) -> Consumer:
        conf = {
            "bootstrap.servers": local_stack.bootstrap_servers,
            "group.id": unique_name("reader"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **extra,
        }
        consumer = Consumer(conf)
        consumer.subscribe(list(topics))
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


@pytest.fixture
def redis_client(local_stack: LocalStack) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(local_stack.redis_url)
    yield client
    client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """An extra redis-server the test owns (to take down mid-run)."""

    port: int
    process: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> None:
        """Start it again on the same port (empty: nothing is saved)."""
        self.stop()
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL)
        _wait_for_ping(self.port)


def _wait_for_ping(port: int) -> None:
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    client.close()


@pytest.fixture
def redis_server_factory(
    local_stack: LocalStack, tmp_path: Path
) -> Iterator[Callable[[], RedisServer]]:
    """Start extra Redis servers (the binary the stack script installed)."""
    servers: list[RedisServer] = []
    binary = shutil.which("redis-server")
    assert binary, "scripts/stack_up.sh installs redis-server"

    def make() -> RedisServer:
        port = _free_port()
        args = [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ]
        process = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        _wait_for_ping(port)
        server = RedisServer(port, process, args)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def pytest_configure(config: pytest.Config) -> None:
    """Mark this session's environment before anything is started (see tests/processes.py)."""
    if not hasattr(config, "workerinput"):  # one marker per session, not per xdist worker
        mark_session()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session if a process it started is still alive (then kill those)."""
    marker = os.environ.get(SESSION_ENV)
    if not marker or hasattr(session.config, "workerinput"):
        return
    alive = leftovers(marker, float(os.environ.get(LEFTOVER_GRACE_ENV, "15")))
    if not alive:
        return
    lines = [describe(pid) for pid in alive]
    kill_marked(SESSION_ENV, marker)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"{len(alive)} process(es) started by this test session outlived it (killed now):"
    if reporter is not None:
        reporter.write_line("")
        reporter.write_line(message, red=True, bold=True)
        for line in lines:
            reporter.write_line(f"  {line}", red=True)
    else:
        print(message, *lines, sep="\n  ")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use the stack are ``integration``; the rest run without servers.

    The files with the most ``slow`` tests come first (a stable sort: each file's tests stay
    together and in order, so module fixtures are made once). ``make test`` runs the files on
    three pytest-xdist workers (``--dist loadfile``), each handed the next file when it is free:
    the long files start early and the many short ones even out the end.
    """
    slow_in_file: dict[str, int] = {}
    for item in items:
        if "local_stack" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)
        slow = item.get_closest_marker("slow") is not None
        slow_in_file[item.path.as_posix()] = slow_in_file.get(item.path.as_posix(), 0) + slow
    items.sort(key=lambda item: -slow_in_file[item.path.as_posix()])


os.environ.setdefault("OMP_NUM_THREADS", "2")
