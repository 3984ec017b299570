"""docker/ parses with the real tools (docker-compose, promtool), and its PromQL names the
pipeline's real metrics. No Docker engine needed; scripts/install_tools.sh brings the tools."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.observability.metrics import Metrics
from tests.docker.promql import (
    ALERTS,
    DOCKER_DIR,
    REPO_ROOT,
    SCRAPE_CONFIG,
    alert_queries,
    checked_parts,
    dashboard_queries,
    metric_names,
)

COMPOSE = DOCKER_DIR / "compose.yaml"
COMPOSE_V2 = Path(__file__).with_name("compose_v2")
"""A Go program printing the file as compose v2 reads it (compose-go, `docker compose`'s loader)."""
OFFICIAL_IMAGES = {
    "kafka": "apache/kafka:4.1.1",
    "redis": "redis:7",
    "prometheus": "prom/prometheus:v2.55.1",
    "grafana": "grafana/grafana:11.3.0",
    "init": "streamrank:cpu",
    "scorer": "streamrank:cpu",
    "producer": "streamrank:cpu",
    "scorer-gpu": "streamrank:cuda",
}


@pytest.fixture(scope="module", autouse=True)
def tools() -> None:
    subprocess.run([str(REPO_ROOT / "scripts" / "install_tools.sh")], check=True, timeout=900)


def _user_env() -> dict[str, str]:
    """This shell's environment without the variables a user of the file would not have set
    (STREAMRANK_*, COMPOSE_*, and the image variables of docker/.env)."""
    images = {name for name in _env_file() if name.endswith("_IMAGE")}
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("STREAMRANK", "COMPOSE")) and k not in images
    }


def _compose(*args: str) -> str:
    """``docker-compose -f docker/compose.yaml ARGS`` from the repository root, as a user runs
    it (no STREAMRANK_*/compose variables of this shell leaking in)."""
    done = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), *args],
        cwd=REPO_ROOT,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _env_file() -> dict[str, str]:
    lines = (DOCKER_DIR / ".env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))


@pytest.fixture(scope="module")
def compose_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(_compose("config"))
    return config


def test_compose_config_resolves_every_service(compose_config: dict[str, Any]) -> None:
    services = compose_config["services"]
    default = {name for name, service in services.items() if not service.get("profiles")}
    assert default == {"kafka", "redis", "init", "scorer", "producer", "prometheus", "grafana"}
    assert services["scorer-gpu"]["profiles"] == ["gpu"]


def test_streamrank_services_share_one_set_of_settings_from_the_env_file(
    compose_config: dict[str, Any],
) -> None:
    env = _env_file()
    services = compose_config["services"]
    shared = services["scorer"]["environment"]
    assert services["producer"]["environment"] == shared
    init = dict(services["init"]["environment"])
    assert init.pop("STREAMRANK_INIT_EVENTS") == env["INIT_EVENTS"]
    assert init == shared
    assert shared["STREAMRANK_KAFKA__BOOTSTRAP_SERVERS"] == f"kafka:{env['KAFKA_PORT']}"
    assert shared["STREAMRANK_REDIS__URL"] == f"redis://redis:{env['REDIS_PORT']}/0"
    assert shared["STREAMRANK_TOPICS__INPUT"] == env["TOPIC_INPUT"]
    assert shared["STREAMRANK_TOPICS__PARTITIONS"] == env["TOPIC_PARTITIONS"]
    assert shared["STREAMRANK_METRICS__PORT"] == "9464"  # what prometheus.yml scrapes
    assert "9464" in SCRAPE_CONFIG.read_text()
    kafka = services["kafka"]["environment"]
    assert kafka["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://kafka:{env['KAFKA_PORT']}"


def test_scorer_scales_in_one_group(compose_config: dict[str, Any]) -> None:
    scorer = compose_config["services"]["scorer"]
    assert "container_name" not in scorer and "ports" not in scorer
    assert scorer["environment"]["STREAMRANK_KAFKA__GROUP_ID"] == _env_file()["CONSUMER_GROUP"]
    assert scorer["command"] == ["run", "--nproc", _env_file()["STREAMRANK_NPROC"]]
    assert scorer["depends_on"]["init"]["condition"] == "service_completed_successfully"


def test_gpu_profile_reserves_nvidia_devices_and_builds_cuda() -> None:
    config = yaml.safe_load(_compose("--profile", "gpu", "config"))
    gpu = config["services"]["scorer-gpu"]
    assert gpu["build"]["args"]["ACCEL"] == "cuda"
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]


def test_official_images_by_default(compose_config: dict[str, Any]) -> None:
    """Without the check's variables, every service runs the official image (the Dockerfile's
    base is python:3.11-slim-bookworm)."""
    config = yaml.safe_load(_compose("--profile", "gpu", "config"))
    images = {name: service["image"] for name, service in config["services"].items()}
    assert images == OFFICIAL_IMAGES
    for name in ("init", "scorer", "producer", "scorer-gpu"):
        assert config["services"][name]["build"]["args"]["PYTHON_IMAGE"] == (
            "python:3.11-slim-bookworm"
        )


def _ports(ports: list[Any]) -> list[str]:
    """``HOST_IP:PUBLISHED:TARGET/PROTOCOL`` from v1's strings or v2's mappings."""
    return sorted(
        p
        if isinstance(p, str)
        else f"{p['host_ip']}:{p['published']}:{p['target']}/{p.get('protocol', 'tcp')}"
        for p in ports
    )


def _volumes(volumes: list[Any]) -> list[tuple[str, str, bool]]:
    """``(source, target, read-only)`` from v1's strings or v2's mappings."""
    out = []
    for v in volumes:
        if isinstance(v, str):
            source, target, mode = [*v.split(":"), "rw"][:3]
            out.append((source, target, mode == "ro"))
        else:
            out.append((v["source"], v["target"], bool(v.get("read_only"))))
    return sorted(out)


def _as_run(service: dict[str, Any]) -> dict[str, Any]:
    """What a service runs, in a form both loaders' output reduce to (v1's `config` writes a
    literal `$` as `$$`, v2's as `$`)."""
    return {
        "image": service.get("image"),
        "entrypoint": [w.replace("$$", "$") for w in service.get("entrypoint") or []],
        "command": service.get("command"),
        "environment": {k: str(v) for k, v in (service.get("environment") or {}).items()},
        "build_args": (service.get("build") or {}).get("args"),
        "healthcheck": (service.get("healthcheck") or {}).get("test"),
        "depends_on": {k: v.get("condition") for k, v in (service.get("depends_on") or {}).items()},
        "profiles": service.get("profiles"),
        "ports": _ports(service.get("ports") or []),
        "volumes": _volumes(service.get("volumes") or []),
        "restart": service.get("restart"),
    }


@pytest.mark.skipif(shutil.which("go") is None, reason="compose v2's loader is built with Go")
def test_compose_v2_reads_the_file_as_v1_does() -> None:
    """Compose v2 (what users have) and Debian's v1 (what `make compose-check` runs here) read
    the same services, images, commands, settings, health checks, ports and volumes."""
    done = subprocess.run(
        ["go", "run", ".", str(COMPOSE), "gpu"],
        cwd=COMPOSE_V2,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    v2 = yaml.safe_load(done.stdout)["services"]
    v1 = yaml.safe_load(_compose("--profile", "gpu", "config"))["services"]
    assert sorted(v2) == sorted(v1)
    for name in v1:
        assert _as_run(v2[name]) == _as_run(v1[name]), name
    assert {name: service["image"] for name, service in v2.items()} == OFFICIAL_IMAGES


def test_promtool_checks_config_and_rules() -> None:
    for args in (["check", "config", str(SCRAPE_CONFIG)], ["check", "rules", str(ALERTS)]):
        done = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_alerts_fire_on_synthetic_series() -> None:
    test_file = Path(__file__).with_name("alerts_test.yml")
    done = subprocess.run(
        ["promtool", "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _exported_names() -> set[str]:
    names = set()
    for family in Metrics().registry.collect():
        names.add(family.name + {"counter": "_total", "info": "_info"}.get(family.type, ""))
    return names | {"streamrank_gpu_memory_bytes", "streamrank_gpu_utilization_ratio"}


def test_every_query_names_metrics_the_pipeline_exports() -> None:
    exported = _exported_names()
    queries = dashboard_queries() + alert_queries()
    assert len(queries) > 15
    used = set()
    for query in queries:
        names = metric_names(query.expr)
        assert names <= exported, f"{query.source}: unknown {names - exported}"
        used |= names
    # Every metric is on the dashboard or in an alert (the hit ratio gauge is the rate panel's).
    assert exported - used <= {"streamrank_feature_cache_hit_ratio"}


def test_gpu_only_panels_query_only_gpu_metrics() -> None:
    gpu = [q for q in dashboard_queries() if q.gpu_only]
    assert gpu, "the dashboard has GPU panels"
    for query in gpu:
        assert all(n.startswith("streamrank_gpu_") for n in metric_names(query.expr)), query


def test_alert_check_rule_splits_threshold_comparisons_and_absent() -> None:
    assert checked_parts("sum(rate(a_total[5m])) / sum(rate(b_total[5m])) > 0.01") == [
        "sum(rate(a_total[5m])) / sum(rate(b_total[5m]))"
    ]
    assert checked_parts('max by (h) (w) > count by (h) (up{job="x"} == 1)') == [
        "max by (h) (w)",
        'count by (h) (up{job="x"} == 1)',
    ]
    assert checked_parts('absent(up{job="x"} == 1)') == ['up{job="x"}']
    assert checked_parts('rate(x{le!="1"}[1m]) >= bool 2') == ['rate(x{le!="1"}[1m])']
