"""Benchmarks of a configured model (``-c FILE`` with ``[model.module]``) on the real broker and
Redis: ``bench model`` and ``bench pipeline`` measure the example's own module (its imported
version, or the module freshly initialised when there is none, said in the report), and
``plan-capacity`` plans from such a report naming the model; a version of another architecture
is one line."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from model.store.versions import ModelVersions
from pipeline.settings.loading import Settings
from tests.integration.byom import Example, prepare_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FACTORY = "torchrec.models.deepfm:SimpleDeepFMNN"


@pytest.fixture
def deepfm(
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    redis_client: redis.Redis,
    unique_name: Callable[[str], str],
) -> tuple[Example, Settings]:
    """The deepfm example's model imported as the current version of ``tmp_path/versions``."""
    return prepare_example(
        "deepfm", tmp_path, settings_factory(), redis_client, unique_name("bench")
    )


def _bench(
    cli: Callable[..., subprocess.Popen],
    settings: Settings,
    ex: Example,
    *args: str,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``streamrank bench ARGS -c <the example's TOML>``, its output captured."""
    proc = cli(
        settings, "bench", *args, "-c", str(ex.toml),
        extra_env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = proc.communicate(timeout=500)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(report, dict)
    return report


def test_bench_model_times_the_configured_modules_version_and_plan_capacity_names_it(
    deepfm: tuple[Example, Settings],
    cli: Callable[..., subprocess.Popen],
    tmp_path: Path,
) -> None:
    ex, settings = deepfm
    version = ModelVersions(settings.model.checkpoint).current()
    report = _report(
        _bench(cli, settings, ex, "model", "--batch-rows", "64", "--seconds", "0.5", "--json")
    )
    assert report["model"] == {
        "model": "configured",
        "factory": FACTORY,
        "model_version": version,
        "weights": "trained",
    }
    assert report["model_version"] == version and report["notes"] == []
    assert 0 < report["batch_rows"] <= 64  # whole events of the example's own candidates
    assert report["rows_per_s"] > 0 and report["same_batch_rows_per_s"] > 0

    saved = tmp_path / "model.json"
    saved.write_text(json.dumps(report) + "\n")
    plan = cli(
        settings, "plan-capacity", "--from", str(saved),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = plan.communicate(timeout=120)
    assert plan.returncode == 0, err[-2000:]
    assert f"model: {FACTORY} (model.json {version})" in out.splitlines()
    assert "gpu_rows_per_s = not measured" in out  # a CPU report gives no GPU figure


def test_bench_model_without_a_version_times_the_module_freshly_initialised(
    deepfm: tuple[Example, Settings],
    cli: Callable[..., subprocess.Popen],
    tmp_path: Path,
) -> None:
    ex, settings = deepfm
    env = {"STREAMRANK_MODEL__CHECKPOINT": str(tmp_path / "no-versions")}
    report = _report(
        _bench(cli, settings, ex, "model", "--batch-rows", "64", "--seconds", "0.3", "--json",
               env=env)
    )  # fmt: skip
    assert report["model"]["weights"] == "untrained" and report["model"]["factory"] == FACTORY
    assert report["model_version"] == "untrained"
    (note,) = report["notes"]
    assert "no version of [model.module]" in note and "freshly initialised" in note


def test_a_version_of_another_architecture_is_one_line(
    deepfm: tuple[Example, Settings],
    cli: Callable[..., subprocess.Popen],
) -> None:
    ex, settings = deepfm
    text = ex.toml.read_text()
    assert "hidden_layer_size = 32" in text
    ex.toml.write_text(text.replace("hidden_layer_size = 32", "hidden_layer_size = 48"))
    for args in (("model", "--seconds", "0.1"), ("pipeline", "--rounds", "1")):
        done = _bench(cli, settings, ex, *args)
        assert done.returncode == 2, done.stderr[-2000:]
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
        assert "was imported for another module (its kwargs differ" in done.stderr
        assert "(model.checkpoint)" in done.stderr


def test_bench_pipeline_drains_the_configured_models_events_through_its_pipeline(
    deepfm: tuple[Example, Settings],
    cli: Callable[..., subprocess.Popen],
) -> None:
    ex, settings = deepfm
    version = ModelVersions(settings.model.checkpoint).current()
    args = ("--events", "80", "--per-event-events", "6", "--rounds", "1")
    report = _report(
        _bench(cli, settings, ex, "pipeline", *args, "--model-seconds", "0.3", "--json")
    )
    described = report["pipeline"]
    assert described["built_by"].startswith("pipeline.serve.build_pipeline")
    assert described["model"] == {
        "model": "configured",
        "factory": FACTORY,
        "model_version": version,
        "weights": "trained",
    }
    assert report["rounds"] == 1
    assert report["bare_rows_per_s"] > 0 and report["e2e_rows_per_s"] > 0
    assert report["per_event_rows_per_s"] > 0
    (replayed,) = report["replay"]  # the batched run's own batches, replayed alone
    assert replayed["batches"] > 0
