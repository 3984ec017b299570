"""Fixtures for whole-pipeline tests: a small trained model, its world, seeded features."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from model.features.build import build_model_input
from model.features.spec import FeatureSpec, SparseFeature
from model.serving import Scorer, ScorerFactory
from model.store.checkpoint import load_checkpoint, load_meta, save_checkpoint
from model.synthetic import SampledEvents, SyntheticWorld, feature_columns, to_event_dicts
from model.synthetic.train import train_ranker
from pipeline.connectors.avro.reference import (
    RECOMMENDATION_SCHEMA_FILE,
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
)
from pipeline.connectors.kafka.clients import make_consumer, make_producer, produce
from pipeline.connectors.redis.feature_store import FeatureStoreWriter
from pipeline.models.loader import serving_options
from pipeline.observability.summary import RunSummary
from pipeline.runtime.loop import ScoringPipeline
from pipeline.settings.loading import Settings
from pipeline.settings.model import ModelSettings
from pipeline.stages.enrich.enricher import BatchEnricher
from pipeline.tools.synthetic_io import build_world, seed_world_features
from pipeline.tools.synthetic_settings import SyntheticSettings
from tests.processes import TREE_ENV, kill_marked, new_marker
from tests.support.logs import failure_excerpt

WORLD = SyntheticSettings(
    num_users=400, num_items=3000, num_categories=40, seed=11, min_candidates=5, max_candidates=40
)
TABLE_ROWS = {
    SparseFeature.USER_ID: 2000,
    SparseFeature.ITEM_ID: 5000,
    SparseFeature.ITEM_CATEGORY: 100,
    SparseFeature.DEVICE: 16,
    SparseFeature.COUNTRY: 32,
    SparseFeature.RECENT_ITEMS: 5000,
}


def model_settings(checkpoint: Path) -> ModelSettings:
    return ModelSettings(
        checkpoint=checkpoint,
        device="cpu",
        embedding_dim=16,
        num_embeddings={f.value: n for f, n in TABLE_ROWS.items()},
        dense_arch=[32, 16],
        over_arch=[32, 1],
        recent_items_cap=8,
    )


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small DLRM trained on the test world (a few seconds)."""
    path = tmp_path_factory.mktemp("model") / "ckpt"
    settings = Settings(model=model_settings(path), synthetic=WORLD)
    spec = settings.model.feature_spec()
    result = train_ranker(spec, build_world(settings), num_events=1500, epochs=1, seed=0)
    save_checkpoint(result.ranker, spec, path, metrics={"auc": result.auc})
    return path


@pytest.fixture(scope="session")
def world() -> SyntheticWorld:
    return build_world(Settings(synthetic=WORLD))


@pytest.fixture(scope="session")
def spec(trained_checkpoint: Path) -> FeatureSpec:
    return Settings(model=model_settings(trained_checkpoint)).model.feature_spec()


@pytest.fixture
def pipeline_settings(
    settings_factory: Callable[..., Settings],
    trained_checkpoint: Path,
    world: SyntheticWorld,
) -> Settings:
    """Settings on fresh topics/group/prefix, with the world's features seeded in Redis."""
    settings = settings_factory(model=model_settings(trained_checkpoint), synthetic=WORLD)
    seed_features(settings, world)
    return settings


def seed_features(settings: Settings, world: SyntheticWorld) -> None:
    client = redis.Redis.from_url(settings.redis.url)
    seed_world_features(world, FeatureStoreWriter(client, settings.redis.key_prefix))
    client.close()


@dataclass
class SentEvents:
    """Events a test produced, as sampled (for offline scoring) and as sent."""

    sampled: SampledEvents
    records: list[dict[str, Any]]

    @property
    def ids(self) -> set[str]:
        return {r["event_id"] for r in self.records}


@pytest.fixture
def send_events(world: SyntheticWorld) -> Callable[..., SentEvents]:
    """Produce ``n`` synthetic events (fresh ids) to ``settings.topics.input``."""
    rng = np.random.default_rng()

    def send(
        settings: Settings,
        n: int,
        extra_values: list[bytes] | None = None,
        flush_timeout_s: float = 30.0,
    ) -> SentEvents:
        sampled = world.sample_events(n, rng)
        records = list(to_event_dicts(sampled, world))
        codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
        producer = make_producer(settings.kafka.config)
        now = int(time.time() * 1000)
        extras = list(extra_values or [])
        stride = max(1, n // (len(extras) + 1))
        for i, record in enumerate(records):
            record["event_time"] = now
            produce(
                producer,
                settings.topics.input,
                codec.encode(record),
                key=str(record["user_id"]).encode(),
            )
            if extras and i % stride == stride - 1:
                produce(producer, settings.topics.input, extras.pop())
        for value in extras:
            produce(producer, settings.topics.input, value)
        assert producer.flush(flush_timeout_s) == 0
        return SentEvents(sampled, records)

    return send


def spec_of(settings: Settings) -> FeatureSpec:
    """The feature spec of the checkpoint ``settings`` serve."""
    return load_meta(settings.model.checkpoint).spec


def checkpoint_scorer(settings: Settings) -> Scorer:
    """The served model of ``settings`` (the checkpoint on the CPU), as ``run`` builds it."""
    return ScorerFactory(serving_options(settings)).create_scorer()


class BackgroundPipeline:
    """A ScoringPipeline running in a thread of the test process.

    Args:
        settings: the run's settings.
        scorer: the model (default: the settings' checkpoint).
        enricher: the feature source (default: Redis as configured).
        pipeline: a pipeline built already (e.g. by :func:`pipeline.serve.build_pipeline`,
            which also loads the retrieval index and follows a versions directory).
    """

    def __init__(
        self,
        settings: Settings,
        scorer: Scorer | None = None,
        enricher: BatchEnricher | None = None,
        pipeline: ScoringPipeline | None = None,
    ) -> None:
        self.pipeline = pipeline or ScoringPipeline(
            settings, scorer or checkpoint_scorer(settings), enricher=enricher
        )
        self.summary: RunSummary | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.summary = self.pipeline.run()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def start(self) -> BackgroundPipeline:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        """Whether the pipeline is still running (it has not returned or raised)."""
        return self._thread.is_alive()

    def stop(self, timeout: float = 60) -> RunSummary:
        self.pipeline.stop()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "pipeline did not stop"
        if self.error is not None:
            raise self.error
        assert self.summary is not None
        return self.summary


@pytest.fixture
def background_pipeline() -> Iterator[Callable[..., BackgroundPipeline]]:
    started: list[BackgroundPipeline] = []

    def start(settings: Settings, **wrappers: Any) -> BackgroundPipeline:
        bp = BackgroundPipeline(settings, **wrappers).start()
        started.append(bp)
        return bp

    yield start
    for bp in started:
        if bp._thread.is_alive():
            bp.pipeline.stop()
            bp._thread.join(30)


def collect(
    settings: Settings,
    expected: int,
    timeout_s: float = 90.0,
    isolation_level: str = "read_committed",
) -> list[dict[str, Any]]:
    """All recommendations on the output topic: waits for ``expected``, then reads on to the
    end of every partition (the end as it is then: what a pipeline still running produces
    later is not waited for).

    The partitions are read from the beginning by assignment (no consumer group to join).
    ``isolation_level="read_uncommitted"`` also returns the records of aborted (and still open)
    transactions; ``read_committed`` ends a partition at its last stable offset."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    topic = settings.topics.output
    codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, topic)
    consumer = make_consumer(
        settings.kafka.config,
        group_id=f"collect-{uuid.uuid4().hex[:8]}",  # never joined: offsets are assigned
        extra={"isolation.level": isolation_level, "enable.partition.eof": True},
    )
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    try:
        partitions = _partitions(consumer, topic, deadline)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.2):
                err = msg.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                    continue
                assert err is None, err
                at_end.discard(msg.partition())
                out.append(codec.decode(msg.value()))
            if len(out) >= expected and at_end >= set(partitions):
                break
    finally:
        consumer.close()
    return out


def _partitions(consumer: Any, topic: str, deadline: float) -> list[int]:
    """The topic's partitions (asked again while its metadata is not there yet)."""
    while True:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        if meta.error is None and meta.partitions:
            return sorted(meta.partitions)
        assert time.monotonic() < deadline, f"topic {topic}: {meta.error}"
        time.sleep(0.2)


def run_cli(
    settings: Settings,
    *args: str,
    extra_env: dict[str, object] | None = None,
    module: str = "pipeline.cli",
    **popen: object,
) -> subprocess.Popen:
    """``python -m MODULE ARGS`` configured by environment variables only (``module``: the
    real entry point, or a tests-only one wrapping it, e.g. ``tests.support.crash_rank``)."""
    env = {
        **os.environ,
        "STREAMRANK_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "STREAMRANK_KAFKA__GROUP_ID": settings.kafka.group_id,
        "STREAMRANK_TOPICS__INPUT": settings.topics.input,
        "STREAMRANK_TOPICS__OUTPUT": settings.topics.output,
        "STREAMRANK_TOPICS__DLQ": settings.topics.dlq,
        "STREAMRANK_REDIS__URL": settings.redis.url,
        "STREAMRANK_REDIS__KEY_PREFIX": settings.redis.key_prefix,
        "STREAMRANK_MODEL__CHECKPOINT": str(settings.model.checkpoint),
        "STREAMRANK_MODEL__DEVICE": "cpu",
        "STREAMRANK_METRICS__ENABLED": "false",
        "STREAMRANK_BATCHING__MAX_BATCH_ROWS": "256",
        **{k: str(v) for k, v in (extra_env or {}).items()},
    }
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        env=env,
        **popen,  # type: ignore[arg-type]
    )


def offline_scores(
    sent: SentEvents, world: SyntheticWorld, spec: FeatureSpec, checkpoint: Path
) -> dict[str, dict[int, float]]:
    """Per event id, the unsharded checkpoint's score of every candidate, from features taken
    straight from the synthetic world (not through Redis or the pipeline's code)."""
    ranker, _ = load_checkpoint(checkpoint)
    ranker.eval()
    cols = feature_columns(sent.sampled, world, spec)
    scores = ranker.score(build_model_input(cols, spec)).double().numpy()
    starts = np.concatenate(([0], np.cumsum(cols.candidate_counts)))
    return {
        record["event_id"]: dict(
            zip(
                record["candidate_item_ids"],
                scores[starts[e] : starts[e + 1]].tolist(),
                strict=True,
            )
        )
        for e, record in enumerate(sent.records)
    }


def max_score_error(recs: list[dict[str, Any]], offline: dict[str, dict[int, float]]) -> float:
    """Largest |pipeline score - offline score| over every returned item; also checks that the
    returned items are the offline top-k (up to ties within 1e-5)."""
    worst = 0.0
    for rec in recs:
        expected = offline[rec["event_id"]]
        for item in rec["items"]:
            worst = max(worst, abs(item["score"] - expected[item["item_id"]]))
        k = len(rec["items"])
        kth_best = sorted(expected.values(), reverse=True)[k - 1]
        assert min(i["score"] for i in rec["items"]) >= kth_best - 1e-5
    return worst


@pytest.fixture
def cli() -> Iterator[Callable[..., subprocess.Popen]]:
    """:func:`run_cli` in a session of its own; at teardown its whole process tree (torchrun
    and the ranks included, wherever they were reparented) is killed."""
    started: list[tuple[subprocess.Popen, str]] = []

    def start(settings: Settings, *args: str, **kwargs: Any) -> subprocess.Popen:
        tree = new_marker()
        env = {**(kwargs.pop("extra_env", None) or {}), TREE_ENV: tree}
        proc = run_cli(settings, *args, extra_env=env, start_new_session=True, **kwargs)
        started.append((proc, tree))
        return proc

    yield start
    for proc, tree in started:
        kill_marked(TREE_ENV, tree)
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def produced_count(settings: Settings, topic: str | None = None) -> int:
    """Records on ``topic`` (default: the output topic), from the partitions' high watermarks."""
    from confluent_kafka import Consumer, TopicPartition

    name = topic or settings.topics.output
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": "watermarks"}
    )
    try:
        partitions = consumer.list_topics(name, timeout=10).topics[name].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        consumer.close()


def wait_for_outputs(
    settings: Settings,
    at_least: int,
    timeout_s: float = 180.0,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
) -> int:
    """Poll the output topic's size every 0.2 s until it reaches ``at_least`` (a topic created
    a moment ago may not have its partition leaders yet: asked again).

    Args:
        settings: whose output topic.
        at_least: records to wait for (transaction markers count too).
        timeout_s: how long; reaching it fails the test.
        proc: the pipeline producing them: its exit before then fails the test.
        log: ``proc``'s log, quoted in the failure.

    Returns:
        The count seen (>= ``at_least``).
    """
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    count = -1
    while count < at_least:
        tail = failure_excerpt(log) if log is not None and log.exists() else ""
        if proc is not None:
            assert proc.poll() is None, f"exited ({proc.returncode}) after {count} outputs\n{tail}"
        assert time.monotonic() < deadline, f"{count}/{at_least} outputs in {timeout_s}s\n{tail}"
        if count >= 0:
            time.sleep(0.2)
        try:
            count = produced_count(settings)
        except KafkaException:
            count = max(count, 0)
    return count


def free_port(count: int = 1) -> int:
    """A TCP port free on the loopback now, followed by ``count - 1`` more free ones (the
    metrics endpoints of ``count`` ranks: rank r listens on the base port + r).

    The port after a free one is often a client's ephemeral port (tests run in parallel), so
    each is bound to check it.
    """
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base = int(sock.getsockname()[1])
        if base + count > 65536:
            continue
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free loopback ports")


def scrape(port: int) -> str:
    """The metrics page on ``port`` ("" while nothing answers there)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


def sample_value(body: str, sample: str) -> float | None:
    """The value of the unlabelled ``sample`` on a metrics page (``None``: not there)."""
    for line in body.splitlines():
        if line.startswith(sample + " "):
            return float(line.split()[1])
    return None
