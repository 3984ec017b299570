"""The capacity plan's arithmetic on small reports (the command: tests/pipeline/cli/
test_plan_capacity.py)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.tools.capacity import CapacityTarget, capacity_plan, render

OVERHEAD = {"non_model_cpu_us_per_event": 50.0, "passthrough_cpu_us_per_event": 4.0}
H200 = {
    "batch_rows": 4096,
    "rows_per_s": 2_000_000.0,
    "same_batch_rows_per_s": 2_100_000.0,
    "device": "cuda:0",
    "device_name": "NVIDIA H200",
}
LATENCY = {
    "capacity_events_per_s": 1000.0,
    "pipeline": {"device": "cuda:0"},
    "loads": [
        {"load": 0.25, "latency_ms": {"p99": 40.0}},
        {"load": 0.5, "latency_ms": {"p99": 90.0}},
        {"load": 0.75, "latency_ms": {"p99": 300.0}},
    ],
}
INGEST_GPU = {
    "transport": {},
    "device": "cuda:0",
    "median": {"0": {"rank_cpu_us_per_event": 80.0}, "2": {"rank_cpu_us_per_event": 10.0}},
}


def _plan(*reports: dict[str, Any], **target: float) -> dict[str, Any]:
    named = [(f"report-{i}.json", r) for i, r in enumerate(reports)]
    plan = capacity_plan(named, CapacityTarget(**target)).as_dict()
    return {name: figure["value"] for name, figure in {**plan["inputs"], **plan["plan"]}.items()}


def test_every_figure_follows_from_the_reports() -> None:
    got = _plan(OVERHEAD, H200, LATENCY, INGEST_GPU)
    assert got["utilisation"] == 0.5  # the largest load whose p99 held under 100 ms
    assert got["rows_per_s"] == 120_000 * 60
    assert got["gpus"] == got["ranks"] == 8  # ceil(7.2M / (2M x 0.5)) = ceil(7.2)
    assert got["worker_cores"] == 12.0  # 120k x 50 us / 0.5
    assert got["ingest_workers"] == 12 and got["ingest_workers_per_gpu"] == 2
    assert got["partitions"] == 16  # 2 per GPU x 8 GPUs
    assert got["rank_us_per_event"] == 10.0  # the run with the most workers
    assert got["host_cores"] == pytest.approx(12.0 + 120_000 * 10e-6 / 0.5)


def test_a_stricter_p99_plans_for_a_lower_load() -> None:
    got = _plan(OVERHEAD, H200, LATENCY, p99_ms=50.0)
    assert got["utilisation"] == 0.25
    assert got["gpus"] == 15  # ceil(7.2M / 0.5M) = ceil(14.4)
    assert got["worker_cores"] == 24.0


def test_cpu_reports_give_no_gpu_figures_and_nothing_is_guessed() -> None:
    cpu_model = {**H200, "device": "cpu", "device_name": None, "rows_per_s": 90_000.0}
    cpu_ingest = {**INGEST_GPU, "device": "cpu"}
    got = _plan(OVERHEAD, cpu_model, cpu_ingest)
    for name in ("gpu_rows_per_s", "gpus", "ranks", "ingest_workers_per_gpu", "partitions"):
        assert got[name] is None, name
    assert got["rank_us_per_event"] is None and got["host_cores"] is None
    assert got["utilisation"] == 0.5  # no latency report: the --utilisation choice
    assert got["ingest_workers"] == 12  # the host side is measured
    text = render(capacity_plan([("m.json", cpu_model)], CapacityTarget()))
    assert "gpu_rows_per_s = not measured" in text and "m.json ran on cpu" in text
    assert "gpus = ceil(rows_per_s / (gpu_rows_per_s x u)) = not measured" in text


def test_an_unknown_report_is_refused() -> None:
    with pytest.raises(ValueError, match="not a report of bench"):
        capacity_plan([("x.json", {"rows": 1})], CapacityTarget())


def _of(model: str, factory: str, version: str) -> dict[str, Any]:
    weights = "untrained" if version == "untrained" else "trained"
    return {"model": model, "factory": factory, "model_version": version, "weights": weights}


DEEPFM = "torchrec.models.deepfm:SimpleDeepFMNN"


def test_a_configured_models_reports_plan_for_that_model_and_say_so() -> None:
    model = {**H200, "model": _of("configured", DEEPFM, "v3")}
    latency = {**LATENCY, "pipeline": {**LATENCY["pipeline"], "model": model["model"]}}
    # bench overhead serves the module untrained: the same model's host work.
    overhead = {**OVERHEAD, "pipeline": {"model": _of("configured", DEEPFM, "untrained")}}
    named = [("overhead.json", overhead), ("model.json", model), ("latency.json", latency)]
    plan = capacity_plan(named, CapacityTarget())
    assert plan.as_dict()["models"]["model.json"] == model["model"]
    assert plan.value("gpus") == 8  # the figures are the reports' as before
    text = render(plan).splitlines()
    assert text[1] == (f"model: {DEEPFM} (overhead.json untrained, model.json v3, latency.json v3)")


def test_reports_of_different_models_are_refused_and_old_reports_said_unrecorded() -> None:
    builtin = {**H200, "model": _of("built-in", "model.ranker:ranker_from_collection", "v1")}
    configured = {**OVERHEAD, "pipeline": {"model": _of("configured", DEEPFM, "v3")}}
    with pytest.raises(
        ValueError, match=r"different models \(o\.json: torchrec.*, m\.json: model\.ranker:"
    ):
        capacity_plan([("o.json", configured), ("m.json", builtin)], CapacityTarget())
    text = render(capacity_plan([("o.json", configured), ("m.json", H200)], CapacityTarget()))
    assert f"model: {DEEPFM} (o.json v3; not recorded in m.json)" in text.splitlines()
    text = render(capacity_plan([("m.json", H200)], CapacityTarget()))
    assert "model: not recorded in the reports" in text.splitlines()
