"""Debian's real Prometheus scrapes a live two-rank pipeline on the local stack; every query of
the Grafana dashboard and every alert expression must return series, and the report tool
draws the run from what Prometheus stored.

Prometheus runs docker/prometheus/prometheus.yml with only its targets rewritten (static
loopback targets for the ranks instead of DNS discovery), a 2 s scrape interval and the alert
rules loaded from docker/prometheus/alerts.yml. Alerts are checked by the rule in
tests/docker/promql.py: each side of the threshold comparison returns series (a healthy run
fires nothing), and the rules evaluate without error.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import matplotlib.image
import pytest
import torch
import yaml
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from pipeline.settings.loading import Settings
from tests.docker.promql import (
    ALERTS,
    REPO_ROOT,
    SCRAPE_CONFIG,
    Query,
    alert_queries,
    checked_parts,
    dashboard_queries,
)
from tests.integration.conftest import SentEvents, free_port, wait_for_outputs
from tests.support.logs import failure_excerpt

pytestmark = pytest.mark.slow

NPROC = 2
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _api(base: str, path: str, **params: Any) -> Any:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def rewrite_targets(config: dict[str, Any], rank_targets: list[str], self_target: str) -> None:
    """The project's scrape config with static targets instead of service discovery."""
    for job in config["scrape_configs"]:
        for key in [k for k in job if k.endswith("_sd_configs") or k == "static_configs"]:
            del job[key]
        targets = rank_targets if job["job_name"] == "streamrank" else [self_target]
        job["static_configs"] = [{"targets": targets}]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[list[str]], str]]:
    """Start Debian's Prometheus on a free port for the given rank targets; returns its URL."""
    subprocess.run([str(REPO_ROOT / "scripts" / "install_tools.sh")], check=True, timeout=900)
    binary = shutil.which("prometheus")
    assert binary
    started: list[subprocess.Popen[bytes]] = []

    def start(rank_targets: list[str]) -> str:
        port = free_port()
        config = yaml.safe_load(SCRAPE_CONFIG.read_text())
        rewrite_targets(config, rank_targets, f"127.0.0.1:{port}")
        config["global"].update(
            {"scrape_interval": "2s", "evaluation_interval": "2s", "scrape_timeout": "2s"}
        )
        config["rule_files"] = [str(ALERTS)]
        config_file = tmp_path / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        log = (tmp_path / "prometheus.log").open("w")
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, failure_excerpt(tmp_path / "prometheus.log")
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2)
                return url
            except OSError:
                assert time.monotonic() < deadline, "prometheus not ready after 60 s"
                time.sleep(0.3)

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(30)


def _series(url: str, expr: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = _api(url, "/api/v1/query", query=expr)["result"]
    return result


def _value(url: str, expr: str) -> float:
    """The single value of an instant query that aggregates to one series."""
    (series,) = _series(url, expr)
    return float(series["value"][1])


def _missing(url: str, queries: list[tuple[Query, str]]) -> list[str]:
    return [f"{q.source}: {expr}" for q, expr in queries if not _series(url, expr)]


def test_every_dashboard_and_alert_query_returns_data_from_a_live_pipeline(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    cli: Callable[..., subprocess.Popen],
    prometheus: Callable[[list[str]], str],
    tmp_path: Path,
) -> None:
    settings = pipeline_settings
    metrics_base = free_port(NPROC)
    ranks = cli(
        settings,
        "run",
        "--nproc",
        str(NPROC),
        extra_env={
            "STREAMRANK_METRICS__ENABLED": "true",
            "STREAMRANK_METRICS__HOST": "127.0.0.1",
            "STREAMRANK_METRICS__PORT": metrics_base,
        },
        stdout=(tmp_path / "ranks.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = prometheus([f"127.0.0.1:{metrics_base + r}" for r in range(NPROC)])
    started_at = time.time()
    _wait_for_assignment(settings, NPROC, ranks, tmp_path / "ranks.log")

    # Two waves of traffic with malformed messages (DLQ), a few seconds apart.
    garbage = [b"\x00\x01garbage\xff", b""]
    send_events(settings, 300, extra_values=list(garbage))
    assert wait_for_outputs(settings, 300) >= 300, failure_excerpt(tmp_path / "ranks.log")
    time.sleep(3)
    send_events(settings, 300, extra_values=list(garbage))
    assert wait_for_outputs(settings, 600) >= 600, failure_excerpt(tmp_path / "ranks.log")
    assert ranks.poll() is None, failure_excerpt(tmp_path / "ranks.log")

    panels = [q for q in dashboard_queries() if not q.gpu_only]
    gpu_panels = [q for q in dashboard_queries() if q.gpu_only]
    alert_parts = [(q, part) for q in alert_queries() for part in checked_parts(q.expr)]
    wanted = [(q, q.expr) for q in panels] + alert_parts
    # Consumer lag arrives with librdkafka's statistics (every 5 s): allow a few scrapes.
    deadline = time.monotonic() + 90
    while (missing := _missing(url, wanted)) and time.monotonic() < deadline:
        time.sleep(2)
    assert not missing, "no data:\n" + "\n".join(missing)

    # Values, not just presence: both ranks up, the DLQ saw the garbage, nothing fires.
    assert _value(url, "sum(streamrank_rank_up)") == NPROC
    assert _value(url, "max(streamrank_world_size)") == NPROC
    steps = _series(url, "streamrank_rank_step_duration_seconds_count > 0")
    assert {s["metric"]["rank"] for s in steps} == {str(r) for r in range(NPROC)}
    dead = _series(url, "sum by (reason) (streamrank_dead_letter_messages_total) > 0")
    assert {s["metric"]["reason"] for s in dead} == {"undecodable", "empty_value"}
    # Prometheus converges on the true count (scrapes can lag on a loaded machine).
    deadline = time.monotonic() + 60
    while (produced := _value(url, "sum(streamrank_produced_recommendations_total)")) < 600:
        assert time.monotonic() < deadline, f"prometheus saw {produced} of 600 recommendations"
        time.sleep(1)
    assert produced == 600
    # Nothing is wrong, except that the first batches of a cold start may be slow: the
    # latency alert is pending exactly when the p99 it watches was over the SLO at the rule's
    # own last evaluation (the p99 read now may have crossed the SLO since).
    state, p99 = _rule_states_and_latency_p99(url)
    assert all(health == "ok" for health, _, _ in state.values()), state
    expected = {name: "inactive" for name in state}
    over_slo = p99 is not None and p99 > 0.5
    expected["StreamrankP99LatencyOverSLO"] = "pending" if over_slo else "inactive"
    assert {name: v[1] for name, v in state.items()} == expected, (p99, state)
    if not torch.cuda.is_available():  # CPU ranks export no GPU series
        assert gpu_panels and all(not _series(url, q.expr) for q in gpu_panels)

    # `streamrank report` draws the run from what Prometheus stored.
    since = f"{int(time.time() - started_at) + 5}s"
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "report",
            "--out",
            str(tmp_path / "report"),
            "--prometheus",
            url,
            "--since",
            since,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report.returncode == 0, report.stderr[-2000:]
    names = ["throughput.png", "latency.png", "dlq.png", "batch_rows.png"]
    paths = [tmp_path / "report" / name for name in names]
    for path in paths:
        assert path.read_bytes().startswith(PNG_MAGIC), path
        assert _colored_pixels(path) > 200, f"{path}: no plotted line (a 'no data' plot?)"

    # The run has no --exit-when-idle: stop it as an orchestrator would (SIGTERM to the
    # launcher); every rank drains and the job exits 0.
    ranks.send_signal(signal.SIGTERM)
    assert ranks.wait(60) == 0, failure_excerpt(tmp_path / "ranks.log")


def _rule_states_and_latency_p99(
    url: str,
) -> tuple[dict[str, tuple[str, str, str]], float | None]:
    """Every rule's (health, state, last error), and the latency alert's p99 at the instant
    that rule was last evaluated (None where the query had no series then).

    A scrape that started before that instant can land just after it; the rule then saw one
    sample less than the query does. Such a disagreement lasts one evaluation (2 s), so the
    pair is read again, up to three times, before the caller compares them.
    """
    latency = checked_parts(_alert("StreamrankP99LatencyOverSLO").expr)[0]
    for _ in range(3):
        rules = [r for g in _api(url, "/api/v1/rules")["groups"] for r in g["rules"]]
        assert len(rules) == len(alert_queries())
        state = {r["name"]: (r["health"], r["state"], r.get("lastError", "")) for r in rules}
        rule = next(r for r in rules if r["name"] == "StreamrankP99LatencyOverSLO")
        series = _api(url, "/api/v1/query", query=latency, time=rule["lastEvaluation"])["result"]
        p99 = float(series[0]["value"][1]) if series else None
        if (rule["state"] == "pending") == (p99 is not None and p99 > 0.5):
            break
        time.sleep(2.5)
    return state, p99


def _alert(name: str) -> Query:
    return next(q for q in alert_queries() if q.source == f"alert {name}")


def _wait_for_assignment(
    settings: Settings, members: int, ranks: subprocess.Popen, log: Path
) -> None:
    """Until the group has ``members`` members holding every input partition (so the events
    sent next are not waiting for the ranks to start)."""
    admin = AdminClient(settings.kafka.config.admin)
    group = settings.kafka.group_id
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert ranks.poll() is None, failure_excerpt(log)
        try:
            description = admin.describe_consumer_groups([group])[group].result(timeout=5)
        except (KafkaException, concurrent.futures.TimeoutError):  # no group/coordinator yet
            time.sleep(0.5)
            continue
        owned = [
            tp
            for member in description.members
            for tp in member.assignment.topic_partitions
            if tp.topic == settings.topics.input
        ]
        if len(description.members) == members and len(owned) == settings.topics.partitions:
            return
        time.sleep(0.5)
    raise AssertionError("the ranks never got the input partitions: " + failure_excerpt(log))


def _colored_pixels(path: Path) -> int:
    """Pixels of a saturated colour: the plotted lines (axes, text and grid are grey)."""
    rgb = matplotlib.image.imread(path)[..., :3]
    return int(((rgb.max(axis=-1) - rgb.min(axis=-1)) > 0.25).sum())
