"""``streamrank bench soak``: its measurements and checks without servers (the real command
runs on the stack, with tiny sizes, in tests/pipeline/cli/test_readme_commands.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from pipeline.observability.metrics import Metrics
from pipeline.tools.bench.soak import plot as soak_plot
from pipeline.tools.bench.soak.plan import SoakPlan, SoakRun, evaluate
from pipeline.tools.bench.soak.plot import plot_soak
from pipeline.tools.bench.soak.probe import MetricsScrape, bucket_quantile, window_quantile
from pipeline.tools.bench.soak.sampler import Sample
from tests.pipeline.tools.bench_cli import assert_one_line_user_error

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MIB = 2**20


def test_bucket_quantile_interpolates_like_promql() -> None:
    buckets = [(0.1, 0.0), (0.2, 10.0), (math.inf, 10.0)]
    assert bucket_quantile(0.5, buckets) == pytest.approx(0.15)
    assert bucket_quantile(0.99, [(0.1, 5.0), (math.inf, 10.0)]) == 0.1  # +Inf: largest bound
    assert bucket_quantile(0.5, [(0.1, 4.0), (math.inf, 4.0)]) == pytest.approx(0.05)
    assert bucket_quantile(0.99, [(0.1, 0.0), (math.inf, 0.0)]) is None


def test_window_quantile_sees_only_the_events_between_two_scrapes() -> None:
    metrics = Metrics()
    for _ in range(1000):
        metrics.end_to_end_seconds.observe(0.003)
    metrics.events_out.inc(1000)
    earlier = MetricsScrape.parse(generate_latest(metrics.registry).decode())
    for _ in range(100):
        metrics.end_to_end_seconds.observe(0.3)
    metrics.events_out.inc(100)
    later = MetricsScrape.parse(generate_latest(metrics.registry).decode())

    assert later.recommendations == 1100 and earlier.recommendations == 1000
    assert later.latency_buckets[-1] == (math.inf, 1100)
    p99 = window_quantile(0.99, earlier, later)
    assert p99 is not None and 0.25 < p99 <= 0.5  # the window's bucket, not the 3 ms mass
    assert window_quantile(0.99, later, later) is None  # nothing scored in between
    assert window_quantile(0.99, later, earlier) is None  # counters went back: a restart


def _samples(
    rss_mib: list[float], lags: list[int], phases: list[str] | None = None, every_s: float = 10.0
) -> SoakRun:
    phases = phases or ["load"] * len(rss_mib)
    samples = [
        Sample(t_s=every_s * i, phase=phase, rss_bytes=int(r * MIB), lag=lag, p99_ms=50.0,
               recommendations=100.0 * i)
        for i, (r, lag, phase) in enumerate(zip(rss_mib, lags, phases, strict=True))
    ]  # fmt: skip
    return SoakRun(samples, events_on_input=500, pipeline_exit=0, producer_exit=0, lag_after_stop=0)


def test_evaluate_checks_the_rss_slope_and_lag_only_after_the_warm_up() -> None:
    plan = SoakPlan(warmup_s=20.0, max_growth_24h=0.10, max_lag_s=2.0)
    # RSS doubles during warm-up (t < 20 s), then stays flat; lag spikes only in warm-up.
    run = _samples([100, 150, 200, 200, 200, 200], [900, 10, 20, 15, 0, 0])
    result = evaluate(plan, rate=100.0, run=run)
    assert result["rss"]["mib_per_hour"] == 0.0 and result["rss"]["shape"] == "flat"
    assert result["rss_base_bytes"] == 200 * MIB and result["rss_growth"] == 0.0
    assert result["max_lag_after_warmup"] == 20 and result["lag_bound"] == 200.0
    assert result["samples_after_warmup"] == 4
    assert result["passed"] and all(result["checks"].values())
    lagging = evaluate(plan, 100.0, _samples([100] * 6, [0, 0, 0, 201, 0, 0]))
    assert not lagging["checks"]["lag_bounded"] and not lagging["passed"]


def test_a_steady_climb_fails_even_when_the_window_grows_under_five_percent() -> None:
    # 6 MiB a minute on 1,200 MiB for 10 minutes after warm-up: +5% in the window, +720% a day.
    plan = SoakPlan(warmup_s=60.0)
    rss = [1100.0] + [1200 + 6 * minute for minute in range(11)]
    result = evaluate(plan, 100.0, _samples(rss, [0] * len(rss), every_s=60.0))
    trend = result["rss"]
    assert trend["mib_per_hour"] == pytest.approx(360.0, rel=1e-6)
    assert trend["growth_24h"] == pytest.approx(360 * 24 / 1230, rel=1e-3)  # later half's start
    assert trend["shape"] == "growing" and not result["checks"]["rss_slope"]
    assert result["rss_growth"] == pytest.approx(0.05)  # what the old end-point check saw


def test_steps_every_two_minutes_are_a_climb_and_a_fill_that_stops_is_a_plateau() -> None:
    plan = SoakPlan(warmup_s=0.0)
    steps = [1200 + 15 * (minute // 2) for minute in range(20)]  # +15 MiB every 2 minutes
    stepped = evaluate(plan, 100.0, _samples(steps, [0] * 20, every_s=60.0))
    assert stepped["rss"]["shape"] == "growing" and not stepped["checks"]["rss_slope"]
    # a cache touching its pages for 8 minutes, then full: the later half is flat
    filling = [1200 + 4 * min(minute, 8) for minute in range(20)]
    filled = evaluate(plan, 100.0, _samples(filling, [0] * 20, every_s=60.0))
    assert filled["rss"]["fits"]["whole"]["growth_24h"] > 0.10
    assert filled["rss"]["mib_per_hour"] == 0.0 and filled["rss"]["shape"] == "filling"
    assert filled["checks"]["rss_slope"] and filled["passed"]


def test_evaluate_fails_a_lost_event_an_undrained_lag_a_bad_exit_and_no_samples() -> None:
    plan = SoakPlan(warmup_s=0.0)
    ok = _samples([100] * 3, [0] * 3)
    assert evaluate(plan, 100.0, ok)["passed"]
    for change, check in (
        ({"missing": 1}, "nothing_lost"),
        ({"lag_after_stop": 7}, "drained"),
        ({"pipeline_exit": 1}, "clean_exit"),
        ({"producer_exit": -9}, "clean_exit"),
    ):
        run = _samples([100] * 3, [0] * 3)
        for name, value in change.items():
            setattr(run, name, value)
        result = evaluate(plan, 100.0, run)
        assert not result["checks"][check] and not result["passed"], change
    # Only drain samples (the load ended before the warm-up did): nothing to judge RSS by.
    early = evaluate(SoakPlan(warmup_s=100.0), 100.0, _samples([100] * 3, [0] * 3))
    assert early["rss"]["mib_per_hour"] is None and not early["checks"]["rss_slope"]


def test_the_plot_is_a_png_whose_rss_axis_shows_the_climb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = SoakPlan(warmup_s=10.0)
    rss = [1000, 1001, 1003, 1004, 1006, 1006, 1007, 1008]
    run = _samples(rss, [5, 3, 4, 0, 0, 0, 0, 0], ["load"] * 7 + ["drain"])
    result = {"rate": 100.0, "missing": 0, "duplicates": 0, **evaluate(plan, 100.0, run)}
    drawn: list[Any] = []
    saved = soak_plot.Figure.savefig

    def keep(figure: Any, *args: Any, **kwargs: Any) -> None:
        drawn.append(figure)
        saved(figure, *args, **kwargs)

    monkeypatch.setattr(soak_plot.Figure, "savefig", keep)
    path = plot_soak(run.samples, plan, result, tmp_path / "soak.png")
    assert path.read_bytes().startswith(PNG_MAGIC)
    rss_axes = drawn[0].axes[0]
    bottom, top = rss_axes.get_ylim()
    assert 990 < bottom < 1000 and 1008 < top < 1020  # the climb fills the panel
    labels = [line.get_label() for line in rss_axes.get_lines()]
    assert any(label.startswith("fit after warm-up") for label in labels)
    assert any(label.startswith("later half (checked)") for label in labels), labels
    assert "MiB/h after warm-up" in rss_axes.get_title()


@pytest.mark.parametrize("args", [("--load", "1.5"), ("--minutes", "0")])
def test_bad_options_are_one_line_user_errors(args: tuple[str, ...]) -> None:
    assert_one_line_user_error("soak", *args)


def test_one_transient_sample_does_not_tilt_the_fit() -> None:
    # Flat at 1,172 MiB, but the last sample caught a large batch's memory mapped for a moment
    # (+9 MiB, returned right after): a least-squares line through the later half would
    # project +160% a day; the median of pairwise slopes stays flat.
    plan = SoakPlan(warmup_s=0.0)
    rss = [1172.0] * 30 + [1181.0]
    result = evaluate(plan, 100.0, _samples(rss, [0] * len(rss)))
    assert result["rss"]["mib_per_hour"] == 0.0 and result["checks"]["rss_slope"]
