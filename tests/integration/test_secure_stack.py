"""The whole pipeline on a secure stack: ``scripts/stack_up.sh --secure`` (what ``make stack-up
SECURE=1`` runs), started by this module in a temp dir of its own.

Kafka accepts only SASL_SSL (SCRAM-SHA-512 over TLS) and Redis only TLS with a password, with a
throw-away CA and random passwords. The CLI, configured by nothing but the stack's ``env`` file,
seeds features, produces events, scores them all with Redis features (no fallback) and reads
them back; no password appears in any command's output, the run summary, the metrics or the
servers' logs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.conftest import REPO_ROOT, _read_env, stack_down
from tests.integration.conftest import WORLD
from tests.support.logs import failure_excerpt

pytestmark = [pytest.mark.slow, pytest.mark.integration]

EVENTS = 300
MALFORMED = 3


@dataclass(frozen=True)
class SecureStack:
    """A running secure stack: its directory, its ``env`` and its passwords."""

    directory: Path
    env: dict[str, str]
    secrets: dict[str, str]

    @property
    def passwords(self) -> dict[str, str]:
        return {k: v for k, v in self.secrets.items() if k.endswith("_PASSWORD")}


def _read_secrets(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


@pytest.fixture(scope="module")
def secure_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureStack]:
    directory = tmp_path_factory.mktemp("secure-stack")
    try:
        done = subprocess.run(
            [str(REPO_ROOT / "scripts" / "stack_up.sh"), "--secure", str(directory)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        yield SecureStack(
            directory, _read_env(directory / "env"), _read_secrets(directory / "secrets")
        )
    finally:
        stack_down(directory)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cli(env: dict[str, str], *args: str, log: Path) -> subprocess.Popen[bytes]:
    """``python -m pipeline.cli ARGS`` with ``env``; stdout to ``log``, stderr to ``.err``."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", *args],
        env=env,
        stdout=log.open("wb"),
        stderr=log.with_suffix(".err").open("wb"),
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 300) -> None:
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(30)
        raise
    assert code == 0, failure_excerpt(log.with_suffix(".err"))


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


def _sample(body: str, name: str) -> float:
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def test_the_secure_stack_refuses_plaintext_and_wrong_credentials(
    secure_stack: SecureStack,
) -> None:
    env = secure_stack.env
    redis_port = int(env["STREAMRANK_REDIS__URL"].rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(redis.ConnectionError):  # no TLS
        redis.Redis(port=redis_port, socket_timeout=5).ping()
    tls = {"ssl": True, "ssl_ca_certs": env["STREAMRANK_REDIS__SSL_CA_CERTS"]}
    with pytest.raises(redis.AuthenticationError):  # TLS, no password
        redis.Redis(port=redis_port, socket_timeout=5, **tls).ping()
    password = secure_stack.secrets["REDIS_PASSWORD"]
    assert redis.Redis(port=redis_port, password=password, socket_timeout=5, **tls).ping()

    secure = {
        "bootstrap.servers": env["STREAMRANK_KAFKA__BOOTSTRAP_SERVERS"],
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": env["STREAMRANK_KAFKA__SASL_USERNAME"],
        "sasl.password": env["STREAMRANK_KAFKA__SASL_PASSWORD"],
        "ssl.ca.location": env["STREAMRANK_KAFKA__SSL_CA_LOCATION"],
    }
    AdminClient(secure).list_topics(timeout=30)  # the env's settings get in
    refused = [
        {"bootstrap.servers": secure["bootstrap.servers"]},  # plaintext
        {**secure, "sasl.password": "not-the-password"},
        {k: v for k, v in secure.items() if k != "ssl.ca.location"},  # server not trusted
    ]
    for conf in refused:
        with pytest.raises(KafkaException):
            AdminClient(conf).list_topics(timeout=5)


def test_pipeline_end_to_end_on_the_secure_stack_without_leaking_a_secret(
    secure_stack: SecureStack, trained_checkpoint: Path, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    metrics_port = _free_port()
    env = {
        **os.environ,
        **secure_stack.env,
        "STREAMRANK_TOPICS__INPUT": f"secure-events-{tag}",
        "STREAMRANK_TOPICS__OUTPUT": f"secure-recs-{tag}",
        "STREAMRANK_TOPICS__DLQ": f"secure-dlq-{tag}",
        "STREAMRANK_KAFKA__GROUP_ID": f"secure-{tag}",
        "STREAMRANK_REDIS__KEY_PREFIX": f"secure-{tag}",
        "STREAMRANK_MODEL__CHECKPOINT": str(trained_checkpoint),
        "STREAMRANK_MODEL__DEVICE": "cpu",
        "STREAMRANK_METRICS__ENABLED": "true",
        "STREAMRANK_METRICS__PORT": str(metrics_port),
        **{f"STREAMRANK_SYNTHETIC__{k.upper()}": str(v) for k, v in WORLD.model_dump().items()},
    }
    env.pop("STREAMRANK_CONFIG", None)
    logs = tmp_path / "logs"
    logs.mkdir()
    summary = tmp_path / "summary.json"

    _finish(_cli(env, "seed-features", log=logs / "seed.out"), logs / "seed.out")
    run = _cli(env, "run", "--summary-json", str(summary), log=logs / "run.out")
    scrapes: list[str] = []
    deadline = time.monotonic() + 180
    while not scrapes:  # the endpoint is up once the run has connected to both servers
        assert run.poll() is None, failure_excerpt(logs / "run.err")
        assert time.monotonic() < deadline, "no metrics endpoint"
        body = _scrape(metrics_port)
        if body is None:
            time.sleep(0.5)
        else:
            scrapes.append(body)
    produce = ("produce", "--events", str(EVENTS), "--malformed", str(MALFORMED))
    _finish(_cli(env, *produce, log=logs / "produce.out"), logs / "produce.out")
    produced = "streamrank_produced_recommendations_total"
    while _sample(scrapes[-1], produced) < EVENTS:
        assert run.poll() is None, failure_excerpt(logs / "run.err")
        assert time.monotonic() < deadline, f"{_sample(scrapes[-1], produced)} scored"
        time.sleep(0.5)
        scrapes.append(_scrape(metrics_port) or scrapes[-1])
    run.send_signal(signal.SIGTERM)  # drains, commits and writes the summary
    _finish(run, logs / "run.out")
    consume = ("consume", "--max", str(EVENTS + 1), "--timeout", "10")
    _finish(_cli(env, *consume, log=logs / "consume.out"), logs / "consume.out")

    recs = [json.loads(line) for line in (logs / "consume.out").read_text().splitlines()]
    assert len(recs) == EVENTS and len({r["event_id"] for r in recs}) == EVENTS
    assert all(r["items"] and not r["fallback_features"] for r in recs)  # Redis over TLS
    result = json.loads(summary.read_text())
    assert result["events_out"] == EVENTS and result["dead_lettered"] == MALFORMED
    assert _sample(scrapes[-1], "streamrank_commit_failures_total") == 0

    outputs = {p.name: p.read_text(errors="replace") for p in sorted(logs.iterdir())}
    outputs[summary.name] = summary.read_text()
    outputs.update({f"metrics scrape {i}": body for i, body in enumerate(scrapes)})
    stack = secure_stack.directory
    for path in [*(stack / "logs").rglob("*"), stack / "kafka.out", stack / "redis.out"]:
        if path.is_file():
            outputs[str(path.relative_to(stack))] = path.read_text(errors="replace")
    assert {"seed.err", "run.err", "logs/server.log", "redis.out"} <= set(outputs)
    for name, password in secure_stack.passwords.items():
        leaks = [where for where, text in outputs.items() if password in text]
        assert not leaks, f"{name} appears in {leaks}"
