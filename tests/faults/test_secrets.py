"""No secret in CLI output or logs: a planted SASL password, Redis password and secret client
settings must never be printed, while the commands still say where they connect."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.loading import Settings
from tests.integration.conftest import run_cli

pytestmark = pytest.mark.slow

REDIS_SECRET = "planted-redis-pw-5e1f"
SASL_SECRET = "planted-sasl-pw-77a0"
EXTRA_SECRET = "planted-ssl-key-pw-c3d9"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Callable[[], str]:
    """A redis-server that requires ``REDIS_SECRET``; its URL carries the password."""
    port = _free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--requirepass", REDIS_SECRET, "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield lambda: f"redis://:{REDIS_SECRET}@127.0.0.1:{port}/0"
    os.killpg(proc.pid, 9)
    proc.wait(10)


def test_no_planted_secret_in_cli_output_or_logs(
    pipeline_settings: Settings, redis_with_password: Callable[[], str], tmp_path: Path
) -> None:
    url = redis_with_password()
    settings = pipeline_settings.model_copy(
        update={"redis": pipeline_settings.redis.model_copy(update={"url": url})}
    )
    env = {
        "STREAMRANK_KAFKA__SASL_PASSWORD": SASL_SECRET,
        "STREAMRANK_KAFKA__CONSUMER_EXTRA": f'{{"ssl.key.password": "{EXTRA_SECRET}"}}',
        "STREAMRANK_SYNTHETIC__NUM_USERS": "50",
        "STREAMRANK_SYNTHETIC__NUM_ITEMS": "100",
    }
    outputs = []
    for args in (("seed-features",), ("run", "--exit-when-idle", "1", "--max-events", "1")):
        done = run_cli(
            settings, *args, extra_env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        out, _ = done.communicate(timeout=180)
        outputs.append(out.decode())
    seeded, ran = outputs
    assert "seeded 50 users and 100 items" in seeded and ":***@127.0.0.1" in seeded, seeded
    assert '"events_in"' in ran, ran[-2000:]  # the run connected and printed its summary
    for out in outputs:
        for secret in (REDIS_SECRET, SASL_SECRET, EXTRA_SECRET):
            assert secret not in out, f"{secret} printed:\n{out[-2000:]}"

    # The settings themselves print masked.
    kafka = KafkaSettings(
        sasl_password=SASL_SECRET, consumer_extra={"ssl.key.password": EXTRA_SECRET}
    )
    assert SASL_SECRET not in repr(kafka) and EXTRA_SECRET not in repr(kafka)
    assert kafka.config.consumer["ssl.key.password"] == EXTRA_SECRET  # librdkafka gets it
