"""Bring your own model: both worked examples served by ``streamrank run`` on the real broker and
Redis, one and two ranks, each without and with ingest workers (``batching.ingest_workers =
2``), their scores checked against the module's own forward on inputs this test builds from the
raw events and Redis values (tests/integration/byom.py); a version promoted mid-run swapped in,
in one process and with ingest workers."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import torch
from confluent_kafka import Consumer

from model.module.factory import build_module
from model.module.store import import_state_dict
from model.rank import RankContext
from model.store.versions import ModelVersions
from pipeline.models.preflight import configured_module
from pipeline.observability.metrics import Metrics
from pipeline.serve import build_pipeline
from pipeline.settings.loading import Settings
from pipeline.settings.retrieval import ModelSwapSettings
from pipeline.stages.dead_letter import DETAIL_HEADER, REASON_HEADER
from tests.faults.helpers import dead_letters, members_with_partitions
from tests.integration.byom import (
    Example,
    Stream,
    assert_scores,
    event_id,
    expected_scores,
    make_example,
    prepare_example,
    run_example,
    send,
)
from tests.integration.conftest import (
    BackgroundPipeline,
    collect,
    free_port,
    sample_value,
    scrape,
    wait_for_outputs,
)
from tests.support.late_kernels import LATE_KERNELS_ENV
from tests.support.logs import failure_excerpt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EVENTS = 150


@pytest.fixture(params=["deepfm", "dcn"])
def example(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    redis_client: redis.Redis,
    unique_name: Callable[[str], str],
) -> tuple[Example, Settings]:
    """The example's model imported as the current version, its features seeded."""
    return prepare_example(
        request.param, tmp_path, settings_factory(), redis_client, unique_name("byom")
    )


@pytest.mark.parametrize(
    ("nproc", "workers"), [(1, 0), (2, 0), (1, 2), (2, 2)], ids=["1", "2", "1-w2", "2-w2"]
)
def test_an_example_model_scores_every_event_once_as_its_own_forward(
    nproc: int,
    workers: int,
    example: tuple[Example, Settings],
    redis_client: redis.Redis,
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
    consumer_factory: Callable[..., Consumer],
) -> None:
    ex, settings = example
    records = ex.script.events(EVENTS, seed_=nproc)
    bad = []
    if ex.name == "dcn":  # a listing outside the identity table: dead-lettered, named
        bad = ex.script.events(3, seed_=99)
        for record in bad:
            record["listing_ids"].append(3000 + len(record["listing_ids"]))
    send(settings, ex, records + bad)
    recs = run_example(cli, settings, ex, records, nproc, tmp_path / "run.log", workers)
    assert_scores(recs, records, expected_scores(ex, records, redis_client, ex.reference()))
    # Viewers/shoppers without a Redis record fall back to defaults, flagged.
    no_user = [r for r in recs if "user_features" in r["fallback_features"]]
    assert no_user and len(no_user) < len(recs)
    if bad:
        letters = dead_letters(consumer_factory(settings.topics.dlq), len(bad))
        assert len(letters) == len(bad)
        headers = [dict(m.headers() or []) for m in letters]
        assert {h[REASON_HEADER].decode() for h in headers} == {"id_out_of_range"}
        details = [h[DETAIL_HEADER].decode() for h in headers]
        assert all("features.sparse.listing: id 30" in d for d in details), details


class Served:
    """The pipeline of a swap test: in this process (``ingest_workers = 0``: its own metrics
    registry), or ``streamrank run`` with ingest workers (rank 0's metrics endpoint)."""

    def __init__(
        self,
        settings: Settings,
        ex: Example,
        nproc: int,
        workers: int,
        background_pipeline: Callable[..., BackgroundPipeline],
        cli: Callable[..., subprocess.Popen],
        log: Path,
    ) -> None:
        self.log = log
        self.proc: subprocess.Popen | None = None
        if not workers:
            checkpoint = ModelVersions(settings.model.checkpoint).current_path()
            pipeline = build_pipeline(settings, RankContext(), Metrics(), checkpoint=checkpoint)
            self.registry = pipeline.metrics.registry
            self.background = background_pipeline(settings, pipeline=pipeline)
            return
        self.port = free_port(nproc)
        env = {
            "STREAMRANK_BATCHING__MAX_BATCH_ROWS": "128",
            "STREAMRANK_BATCHING__INGEST_WORKERS": str(workers),
            "STREAMRANK_MODEL_SWAP__POLL_INTERVAL_S": "0.2",
            "STREAMRANK_METRICS__ENABLED": "true",
            "STREAMRANK_METRICS__PORT": str(self.port),
            # A worker starved of CPU on a loaded shared host must not lose its partitions (its
            # uncommitted batches would be scored again: at-least-once, not this test's point).
            "STREAMRANK_KAFKA__SESSION_TIMEOUT_MS": "45000",
        }
        args = ("run", "--nproc", str(nproc), "-c", str(ex.toml))
        out = log.open("w")
        self.proc = cli(settings, *args, extra_env=env, stdout=out, stderr=subprocess.STDOUT)
        members = nproc * workers  # every worker consumes before the events flow
        deadline = time.monotonic() + 300
        while members_with_partitions(settings) != members:
            assert self.proc.poll() is None, failure_excerpt(log, 4000)
            assert time.monotonic() < deadline, "the workers never consumed"
            time.sleep(0.2)

    def sample(self, name: str) -> float | None:
        if self.proc is None:
            return self.registry.get_sample_value(name)
        assert self.proc.poll() is None, failure_excerpt(self.log, 4000)
        return sample_value(scrape(self.port), name)

    def stop(self) -> None:
        if self.proc is None:
            self.background.stop()
            return
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(120) == 0, failure_excerpt(self.log, 4000)


@pytest.mark.parametrize(
    ("nproc", "workers"), [(1, 0), (1, 2), (2, 1)], ids=["alone", "w2", "2-ranks-w1"]
)
def test_a_new_version_of_an_example_model_swaps_in_under_load(
    nproc: int,
    workers: int,
    example: tuple[Example, Settings],
    redis_client: redis.Redis,
    tmp_path: Path,
    background_pipeline: Callable[..., BackgroundPipeline],
    cli: Callable[..., subprocess.Popen],
) -> None:
    ex, settings = example
    settings = settings.model_copy(update={"model_swap": ModelSwapSettings(poll_interval_s=0.2)})
    versions = ModelVersions(settings.model.checkpoint)
    old = versions.current()
    config, _ = configured_module(settings)
    prefix = settings.model.module.state_dict_prefix if settings.model.module else ""
    retrained = tmp_path / "retrained.pt"
    ex.script.init(retrained, steps=5, seed_=1)
    new = import_state_dict(config, retrained, versions, "retrained", strip_prefix=prefix)
    other = dataclasses.replace(
        config,
        kwargs={**config.kwargs, "dcn_num_layers": 3}
        if ex.name == "dcn"
        else {**config.kwargs, "deep_fm_dimension": 4},
    )
    other_weights = tmp_path / "other.pt"
    torch.save(build_module(other, seed=2).state_dict(), other_weights)
    import_state_dict(other, other_weights, versions, "other-architecture")

    served = Served(settings, ex, nproc, workers, background_pipeline, cli, tmp_path / "run.log")
    stream = Stream(settings, ex, n=1200, rate=120).start()
    assert wait_for_outputs(settings, 150) >= 150
    versions.promote("other-architecture")  # needs a restart: refused, the old one serves on
    deadline = time.monotonic() + 60
    while served.sample("streamrank_model_load_failures_total") != 1:
        assert time.monotonic() < deadline, "the other architecture was not tried"
        time.sleep(0.1)
    versions.promote(new.model_version)
    while served.sample("streamrank_model_swaps_total") != 1:
        assert time.monotonic() < deadline + 60, "the new version was not swapped in"
        time.sleep(0.1)
    records = stream.join()
    recs = collect(settings, expected=len(records))
    served.stop()

    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == {event_id(r) for r in records}, "an event was lost"
    assert max(counts.values()) == 1, "an event was answered twice"
    served_by = Counter(r["model_version"] for r in recs)
    assert set(served_by) == {old, new.model_version} and served_by[new.model_version] > 0
    by_id = {event_id(r): r for r in records}
    for version, weights in ((old, ex.state_dict), (new.model_version, retrained)):
        scored = [r for r in recs if r["model_version"] == version]
        want = expected_scores(
            ex, [by_id[r["event_id"]] for r in scored], redis_client, ex.reference(weights)
        )
        worst = max(
            abs(item["score"] - want[rec["event_id"]][item["item_id"]])
            for rec in scored
            for item in rec["items"]
        )
        assert worst <= 1e-5, f"{version} did not score its events"


@pytest.mark.parametrize("name", ["deepfm", "dcn", "weighted", "sequence"])
def test_bench_overhead_measures_the_configured_path(
    name: str,
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    unique_name: Callable[[str], str],
) -> None:
    ex = make_example(name, tmp_path, unique_name("bench"), tmp_path / "versions", steps=1)
    base = settings_factory()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("STREAMRANK_")},
        "STREAMRANK_KAFKA__BOOTSTRAP_SERVERS": base.kafka.bootstrap_servers,
        "STREAMRANK_REDIS__URL": base.redis.url,
    }
    late = tmp_path / "late-kernels.json"
    result = subprocess.run(
        [sys.executable, "-m", "tests.support.late_kernels", "bench", "overhead", "--events",
         "300", "--json", "-c", str(ex.toml)],
        capture_output=True, text=True, env={**env, LATE_KERNELS_ENV: str(late)}, timeout=400,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["path"] == "configured" and report["events"] == 300
    assert report["stages_us"]["decode"] > 0 and report["stages_us"]["enrich"] > 0
    assert report["non_model_cpu_us_per_event"] > 0
    # every kernel of the configured path was loaded by its stage's warm-up, none by a batch
    assert json.loads(late.read_text()) == []
