"""Benchmark helpers: sample batches, the model under test, reports, the topics of a run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from model.synthetic import SyntheticWorld, WorldConfig
from pipeline.connectors.kafka.clients import ensure_topics
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.loading import Settings
from pipeline.settings.model import ModelSettings
from pipeline.tools.bench import overhead
from pipeline.tools.bench.common import (
    BenchTopics,
    batch_of_rows,
    delete_topics,
    fresh_topics,
    load_or_build_scorer,
)
from pipeline.tools.bench.pipeline import PipelineBench
from tests.conftest import LocalStack


def test_batch_of_rows_holds_whole_events_within_the_row_budget() -> None:
    world = SyntheticWorld(WorldConfig(num_users=50, num_items=200, num_categories=5))
    spec = ModelSettings().feature_spec()
    cols = batch_of_rows(world, spec, rows=300)
    assert 0 < cols.num_rows <= 300
    assert int(cols.candidate_counts.sum()) == cols.num_rows


def test_without_a_checkpoint_an_untrained_model_is_benchmarked(tmp_path: Path) -> None:
    settings = Settings(model=ModelSettings(checkpoint=tmp_path / "none"))
    assert load_or_build_scorer(settings).model_version == "untrained"


def test_fresh_topics_are_new_each_time() -> None:
    settings = Settings()
    (first, tag), (second, _) = fresh_topics(settings), fresh_topics(settings, partitions=7)
    assert first.input != second.input
    assert tag in first.input
    assert second.partitions == 7


def test_pipeline_bench_ratios_and_medians() -> None:
    bench = PipelineBench(
        batch_rows=64,
        bare_rows_per_s=[100.0, 200.0],
        bare_same_batch_rows_per_s=[400.0, 400.0],
        e2e_rows_per_s=[50.0, 150.0],
    )
    report = bench.as_dict()
    assert report["rounds"] == 2
    assert report["e2e_over_bare"] == [0.5, 0.75]
    assert report["e2e_over_bare_median"] == 0.625
    assert report["e2e_over_bare_same_batch"] == [0.125, 0.375]
    assert report["per_event_over_bare"] == []


def test_precision_bench_reports_every_precision_against_fp32(tmp_path: Path) -> None:
    from pipeline.tools.bench.serving import bench_precision

    settings = Settings(
        model=ModelSettings(
            checkpoint=tmp_path / "none",
            embedding_dim=8,
            num_embeddings={"user_id": 1000, "item_id": 1000, "recent_items": 1000},
            dense_arch=[16, 8],
            over_arch=[16, 1],
        )
    )
    report = bench_precision(settings, batch_rows=256, seconds=0.05, rounds=2)
    variants = report["variants"]
    assert set(variants) == {"fp32", "tf32", "bf16"}
    assert variants["fp32"]["max_abs_score_diff"] == 0.0
    assert variants["tf32"]["max_abs_score_diff"] == 0.0  # no TF32 units on a CPU
    assert 0 < variants["bf16"]["max_abs_score_diff"] < 2e-2
    assert all(len(v["rows_per_s"]) == 2 and v["rows_per_s_median"] > 0 for v in variants.values())


def test_stage_clock_charges_nested_stages_exclusively(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = [0.0]
    monkeypatch.setattr(overhead, "cpu_seconds", lambda: cpu[0])

    class Work:
        def outer(self) -> None:
            cpu[0] += 1.0
            self.inner()
            cpu[0] += 2.0

        def inner(self) -> None:
            cpu[0] += 4.0

    work, clock = Work(), overhead.StageClock()
    clock.wrap(work, "outer", "produce")
    clock.wrap(work, "inner", "encode")
    clock.start()
    cpu[0] += 8.0  # outside any stage
    work.outer()
    clock.stop()
    assert clock.seconds["produce"] == 3.0
    assert clock.seconds["encode"] == 4.0
    assert clock.seconds["loop"] == 8.0
    assert sum(clock.seconds.values()) == cpu[0]


@pytest.mark.parametrize("keep", [False, True])
def test_bench_topics_are_deleted_unless_kept(local_stack: LocalStack, keep: bool) -> None:
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=local_stack.bootstrap_servers))
    admin = AdminClient(settings.kafka.config.admin)
    with BenchTopics(settings, keep=keep) as topics:
        made, _ = topics.fresh(partitions=1)
        never_created, _ = topics.fresh()  # a run that failed before creating its topics
        ensure_topics(settings.kafka.config, made)
        names = {made.input, made.output, made.dlq}
        wait_until_listed(admin, names)
    left = set(admin.list_topics(timeout=10).topics)
    if keep:
        assert names <= left
        assert set(delete_topics(settings, sorted(names))) == names
    wait_until_gone(admin, names | {never_created.input})


def wait_until_listed(admin: AdminClient, names: set[str], timeout_s: float = 60.0) -> None:
    """Until the broker's metadata lists ``names`` (a created topic reaches it a little after
    the controller answered the creation: a loaded host saw it missing)."""
    deadline = time.monotonic() + timeout_s
    while not names <= set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, f"never listed: {names}"
        time.sleep(0.2)


def wait_until_gone(admin: AdminClient, names: set[str], timeout_s: float = 60.0) -> None:
    """Until the broker's metadata no longer lists ``names`` (deletion propagates to it)."""
    deadline = time.monotonic() + timeout_s
    while names & set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, f"still listed: {names}"
        time.sleep(0.2)
