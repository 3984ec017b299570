"""A model version promoted while events stream in, on the real broker and Redis: one process
and two ranks swap it in without losing or repeating an event, each input partition's outputs
switch version once, in order; a corrupt version leaves the old one serving, and so does one
whose sharded-checkpoint index would run code (which never runs)."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from model.features.spec import FeatureSpec
from model.rank import RankContext
from model.ranker import build_ranker
from model.store.versions import ModelVersions
from model.synthetic import SyntheticWorld, to_event_dicts
from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec
from pipeline.connectors.kafka.clients import make_consumer, make_producer, produce
from pipeline.observability.metrics import Metrics
from pipeline.serve import build_pipeline
from pipeline.settings.batching import BatchingSettings
from pipeline.settings.loading import Settings
from pipeline.settings.retrieval import ModelSwapSettings
from tests.integration.conftest import (
    WORLD,
    BackgroundPipeline,
    collect,
    model_settings,
    seed_features,
    wait_for_outputs,
)
from tests.support.foreign_checkpoint import foreign_copy, payload_runs
from tests.support.logs import failure_excerpt

pytestmark = pytest.mark.slow

OLD, NEW, CORRUPT, FOREIGN = "ranker-a", "ranker-b", "ranker-corrupt", "ranker-foreign"


@pytest.fixture
def versions(tmp_path: Path, trained_checkpoint: Path, spec: FeatureSpec) -> ModelVersions:
    """The trained test model as the current version, an untrained one beside it, and a copy
    of the trained one whose weights were damaged after it was placed."""
    versions = ModelVersions.create(tmp_path / "models")
    versions.add(trained_checkpoint, version=OLD, promote=True)
    versions.write(build_ranker(spec, seed=1), spec, version=NEW)
    versions.add(trained_checkpoint, version=CORRUPT)
    weights = versions.path(CORRUPT) / "model.pt"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the digest in meta.json no longer matches
    weights.write_bytes(bytes(data))
    return versions


@pytest.fixture
def swap_settings(
    settings_factory: Callable[..., Settings], versions: ModelVersions, world: SyntheticWorld
) -> Settings:
    settings = settings_factory(
        model=model_settings(versions.root),
        synthetic=WORLD,
        batching=BatchingSettings(max_batch_rows=256, max_delay_ms=20),
        model_swap=ModelSwapSettings(poll_interval_s=0.2),
    )
    seed_features(settings, world)
    return settings


class Stream:
    """Produces ``n`` events at ``rate`` per second on a thread; every fifth brings no
    candidates (answered from the retrieval index)."""

    def __init__(self, settings: Settings, world: SyntheticWorld, n: int, rate: float) -> None:
        self.settings, self.world, self.n, self.rate = settings, world, n, rate
        self.ids: list[str] = []
        self.asks: set[str] = set()
        """Ids of the events sent without candidates."""
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Stream:
        self._thread.start()
        return self

    def join(self, timeout_s: float = 120) -> list[str]:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
        return self.ids

    def _run(self) -> None:
        try:
            settings = self.settings
            codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
            producer = make_producer(settings.kafka.config)
            sampled = self.world.sample_events(self.n, np.random.default_rng())
            started = time.monotonic()
            for i, record in enumerate(to_event_dicts(sampled, self.world)):
                time.sleep(max(0.0, started + i / self.rate - time.monotonic()))
                record["event_id"] = f"swap-{uuid.uuid4().hex[:10]}"
                record["event_time"] = int(time.time() * 1000)
                if i % 5 == 4:
                    record["candidate_item_ids"] = []
                    self.asks.add(record["event_id"])
                key = str(record["user_id"]).encode()
                produce(producer, settings.topics.input, codec.encode(record), key=key)
                self.ids.append(record["event_id"])
                producer.poll(0)
            assert producer.flush(30) == 0
        except BaseException as exc:
            self.error = exc


def warm_up(settings: Settings, world: SyntheticWorld, timeout_s: float = 120) -> Stream:
    """A few events, answered before the stream starts: the pipeline is up and scoring."""
    warm = Stream(settings, world, n=25, rate=500).start()
    n = len(warm.join())
    assert wait_for_outputs(settings, n, timeout_s) >= n, "the pipeline is not up"
    return warm


def serve_in_process(
    settings: Settings,
    versions: ModelVersions,
    background_pipeline: Callable[..., BackgroundPipeline],
) -> tuple[BackgroundPipeline, CollectorRegistry]:
    """One process serving ``versions``' current version (following its promotions) in the
    background, and its metrics."""
    pipeline = build_pipeline(
        settings, RankContext(), Metrics(), checkpoint=versions.current_path()
    )
    return background_pipeline(settings, pipeline=pipeline), pipeline.metrics.registry


def wait_for_count(
    registry: CollectorRegistry, name: str, what: str, timeout_s: float = 60
) -> None:
    """Wait until the counter ``name`` is 1 (failing the test, naming ``what``, after
    ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while registry.get_sample_value(name) != 1:
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)


def input_positions(settings: Settings, expected: int) -> dict[str, tuple[int, int]]:
    """event id -> (partition, offset) of every event on the input topic."""
    codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    consumer = make_consumer(
        settings.kafka.config,
        group_id=f"positions-{uuid.uuid4().hex[:8]}",
        extra={"auto.offset.reset": "earliest"},
    )
    consumer.subscribe([settings.topics.input])
    out: dict[str, tuple[int, int]] = {}
    deadline = time.monotonic() + 60
    try:
        while len(out) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                assert msg.error() is None
                out[codec.decode(msg.value())["event_id"]] = (msg.partition(), msg.offset())
    finally:
        consumer.close()
    return out


def assert_switched_once_in_order(
    recs: list[dict[str, Any]],
    ids: list[str],
    asks: set[str],
    positions: dict[str, tuple[int, int]],
) -> dict[int, list[str]]:
    """0 missing, 0 duplicates, and per input partition (by offset) the old version's outputs
    then the new one's. Returns the versions per partition."""
    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == set(ids), f"{len(set(ids) - set(counts))} missing"
    assert max(counts.values()) == 1, "an event was answered twice"
    by_partition: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for rec in recs:
        partition, offset = positions[rec["event_id"]]
        by_partition[partition].append((offset, rec["model_version"]))
    versions = {p: [v for _, v in sorted(pairs)] for p, pairs in by_partition.items()}
    for partition, seen in versions.items():
        switch = seen.index(NEW) if NEW in seen else len(seen)
        assert seen == [OLD] * switch + [NEW] * (len(seen) - switch), partition
    retrieved = [r for r in recs if r["retrieved"]]
    assert {r["event_id"] for r in retrieved} == asks  # answered from the index
    assert all(len(r["items"]) > 0 for r in retrieved)
    return versions


def test_one_process_swaps_mid_stream_and_keeps_a_corrupt_version_out(
    swap_settings: Settings,
    versions: ModelVersions,
    world: SyntheticWorld,
    background_pipeline: Callable[..., BackgroundPipeline],
) -> None:
    bp, registry = serve_in_process(swap_settings, versions, background_pipeline)
    warm = warm_up(swap_settings, world)
    stream = Stream(swap_settings, world, n=1500, rate=150).start()
    assert wait_for_outputs(swap_settings, len(warm.ids) + 300) >= len(warm.ids) + 300
    versions.promote(CORRUPT)
    wait_for_count(registry, "streamrank_model_load_failures_total", "the corrupt version tried")
    served_before = wait_for_outputs(swap_settings, 0)
    versions.promote(NEW)
    wait_for_count(registry, "streamrank_model_swaps_total", "the new version swapped in", 120)
    ids = warm.ids + stream.join()
    recs = collect(swap_settings, expected=len(ids))
    bp.stop()

    asks = warm.asks | stream.asks
    versions_seen = assert_switched_once_in_order(
        recs, ids, asks, input_positions(swap_settings, len(ids))
    )
    assert all(OLD in seen and NEW in seen for seen in versions_seen.values())  # mid-stream
    assert CORRUPT not in {r["model_version"] for r in recs}
    assert sum(1 for r in recs if r["model_version"] == OLD) >= served_before
    assert registry.get_sample_value("streamrank_model_info", {"model_version": NEW}) == 1


def test_a_version_whose_index_runs_code_leaves_the_old_one_serving(
    swap_settings: Settings,
    versions: ModelVersions,
    world: SyntheticWorld,
    trained_checkpoint: Path,
    tmp_path: Path,
    background_pipeline: Callable[..., BackgroundPipeline],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The issue's reproduction: a copy of a trained checkpoint plus a ``.metadata`` pickle
    that creates a file, placed in the versions directory (not imported: import refuses it)
    and promoted. The retrieval index reads the version's tables through the checked reader."""
    marker = tmp_path / "payload-ran"
    assert payload_runs(tmp_path)  # plain pickle (DCP's own reader) would run it
    foreign_copy(trained_checkpoint, versions.root / FOREIGN, marker, FOREIGN)
    bp, registry = serve_in_process(swap_settings, versions, background_pipeline)
    warm = warm_up(swap_settings, world)
    stream = Stream(swap_settings, world, n=600, rate=150).start()
    caplog.set_level(logging.WARNING, logger="pipeline.models.watch")
    versions.promote(FOREIGN)
    wait_for_count(registry, "streamrank_model_load_failures_total", "the foreign version tried")
    ids = warm.ids + stream.join()
    recs = collect(swap_settings, expected=len(ids))
    bp.stop()

    assert not marker.exists()
    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == set(ids) and max(counts.values()) == 1
    assert {r["model_version"] for r in recs} == {OLD}
    failed = [r.getMessage() for r in caplog.records if FOREIGN in r.getMessage()]
    assert len(failed) == 1, failed
    assert f"model version {FOREIGN} failed to load, still serving {OLD}" in failed[0]
    assert "refused sharded checkpoint index" in failed[0]
    assert registry.get_sample_value("streamrank_model_load_failures_total") == 1


def test_two_ranks_swap_at_the_same_step_and_keep_a_corrupt_version_out(
    swap_settings: Settings,
    versions: ModelVersions,
    world: SyntheticWorld,
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
) -> None:
    log_file = tmp_path / "ranks.log"
    proc = cli(
        swap_settings,
        "run",
        "--nproc",
        "2",
        "--exit-when-idle",
        "5",
        extra_env={
            "STREAMRANK_MODEL_SWAP__POLL_INTERVAL_S": "0.3",
            "STREAMRANK_BATCHING__MAX_BATCH_ROWS": "128",
            "STREAMRANK_BATCHING__CONSUME_BATCH_SIZE": "100",
            "COLUMNS": "400",  # log lines unwrapped
        },
        stdout=log_file.open("w"),
        stderr=subprocess.STDOUT,
    )
    warm = warm_up(swap_settings, world, timeout_s=240)
    stream = Stream(swap_settings, world, n=1200, rate=100).start()

    def wait_for_lines(text: str, count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while " ".join(log_file.read_text().split()).count(text) < count:
            assert proc.poll() is None, failure_excerpt(log_file, 4000)
            assert time.monotonic() < deadline, f"no {text!r}: {failure_excerpt(log_file, 4000)}"
            time.sleep(0.2)

    seen = wait_for_outputs(swap_settings, len(warm.ids) + 200)
    assert seen >= len(warm.ids) + 200, failure_excerpt(log_file, 4000)
    versions.promote(CORRUPT)
    wait_for_lines(f"model version {CORRUPT} failed to load, still serving {OLD}", 2)
    versions.promote(NEW)
    wait_for_lines(f"model swapped: {OLD} -> {NEW}", 2)
    ids = warm.ids + stream.join()
    assert proc.wait(300) == 0, failure_excerpt(log_file, 4000)
    recs = collect(swap_settings, expected=len(ids))

    asks = warm.asks | stream.asks
    versions_seen = assert_switched_once_in_order(
        recs, ids, asks, input_positions(swap_settings, len(ids))
    )
    assert any(OLD in seen and NEW in seen for seen in versions_seen.values())
    assert CORRUPT not in {r["model_version"] for r in recs}
