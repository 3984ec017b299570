"""What the benchmarks share: sample batches, the model under test, fresh topics, a timer.

The benchmarks alternate their variants in one process (rounds) so that ratios are not skewed
by a noisy machine drifting between separate runs.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from model.features.build import FeatureColumns
from model.features.model_input import ModelInput
from model.features.spec import FeatureSpec
from model.ranker import build_ranker
from model.serving import Scorer, ScorerFactory
from model.store.versions import NoCurrentVersionError, resolve_checkpoint
from model.synthetic import SyntheticWorld, feature_columns
from pipeline.connectors.kafka.admin import make_admin
from pipeline.connectors.kafka.clients import make_consumer
from pipeline.connectors.redis.feature_store import FeatureStoreWriter
from pipeline.models.loader import serving_options
from pipeline.settings.loading import Settings
from pipeline.settings.topics import TopicsSettings
from pipeline.tools.synthetic_io import build_world, redis_client, seed_world_features

log = logging.getLogger(__name__)


def batch_of_rows(
    world: SyntheticWorld, spec: FeatureSpec, rows: int, seed: int = 0
) -> FeatureColumns:
    """Feature columns of whole events holding at most ``rows`` rows (at least one event).

    Args:
        world: the synthetic world to sample events from.
        spec: the model's feature spec.
        rows: the most (event x candidate) rows to keep.
        seed: sampling seed.

    Returns:
        Columns of the first events whose rows fit in ``rows``.

    Example::

        cols = batch_of_rows(build_world(settings), scorer.spec, 1024)
    """
    rng = np.random.default_rng(seed)
    mean = (world.config.min_candidates + world.config.max_candidates) / 2
    events = world.sample_events(max(1, int(2 * rows / mean) + 1), rng)
    cols = feature_columns(events, world, spec)
    keep = max(1, int(np.searchsorted(np.cumsum(cols.candidate_counts), rows, side="right")))
    return cols.slice_events(0, keep)


def load_or_build_scorer(settings: Settings) -> Scorer:
    """The configured checkpoint's model (a versions directory's current version), or a fresh
    (untrained) one from the configured spec.

    Args:
        settings: ``settings.model`` names the checkpoint, device, quantization and compile.

    Returns:
        A :class:`Scorer`; its ``model_version`` is ``"untrained"`` without a checkpoint.
    """
    try:
        checkpoint = resolve_checkpoint(settings.model.checkpoint)  # a versions dir: current
    except (FileNotFoundError, NoCurrentVersionError):
        checkpoint = None
    if checkpoint is not None:
        return ScorerFactory(serving_options(settings, checkpoint=checkpoint)).create_scorer()
    spec = settings.model.feature_spec()
    log.warning("no checkpoint at %s: benchmarking an untrained model", settings.model.checkpoint)
    return Scorer(
        build_ranker(spec, seed=0), spec, "untrained", torch.device("cpu"), settings.model.precision
    )


def plain_scorer(settings: Settings) -> Scorer:
    """The configured model as fp32 and eager (the baseline of the quantize/compile benches)."""
    plain = settings.model.model_copy(
        update={"quantize": "fp32", "compile": False, "precision": "fp32"}
    )
    return load_or_build_scorer(settings.model_copy(update={"model": plain}))


class BenchTopics:
    """The fresh topics of one benchmark's runs, deleted when it ends unless ``keep``.

    Args:
        settings: the cluster (``settings.kafka``) and the partitions/replication defaults.
        keep: leave the topics on the cluster (``--keep-topics``).

    Example::

        with BenchTopics(settings, keep=False) as topics:
            run_topics, tag = topics.fresh()
            ...  # produce to run_topics.input, run the pipeline
        # the input, output and DLQ topics of every fresh() are deleted here
    """

    def __init__(self, settings: Settings, keep: bool = False) -> None:
        self.settings = settings
        self.keep = keep
        self.made: list[TopicsSettings] = []

    def fresh(self, partitions: int | None = None) -> tuple[TopicsSettings, str]:
        """New topics (see :func:`fresh_topics`), remembered for deletion."""
        topics, tag = fresh_topics(self.settings, partitions)
        self.made.append(topics)
        return topics, tag

    def __enter__(self) -> BenchTopics:
        return self

    def __exit__(self, *_exc: object) -> None:
        names = [name for t in self.made for name in (t.input, t.output, t.dlq)]
        if not names:
            return
        if self.keep:
            log.info("keeping the benchmark's topics: %s", ", ".join(names))
            return
        delete_topics(self.settings, names)


def delete_topics(settings: Settings, names: list[str], timeout_s: float = 30.0) -> list[str]:
    """Delete ``names`` from the cluster; a topic already gone (never created) is no error.

    Args:
        settings: where the cluster is.
        names: the topics to delete.
        timeout_s: how long to wait for the deletions.

    Returns:
        The topics deleted.
    """
    admin = make_admin(settings.kafka.config)
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    wanted = [n for n in names if n in existing]
    if not wanted:
        return []
    deleted = []
    for name, future in admin.delete_topics(wanted, operation_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
            deleted.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                log.warning("could not delete benchmark topic %s: %s", name, exc)
    log.info("deleted the benchmark's topics: %s", ", ".join(deleted))
    return deleted


def fresh_topics(settings: Settings, partitions: int | None = None) -> tuple[TopicsSettings, str]:
    """Topics (and a tag for the consumer group) no earlier run has used.

    Args:
        settings: partitions and replication factor default to ``settings.topics``.
        partitions: partitions of the new topics, when not the configured number.

    Returns:
        ``(topics, tag)``; ``tag`` is the random part of the topic names.
    """
    tag = uuid.uuid4().hex[:8]
    topics = TopicsSettings(
        input=f"bench-events-{tag}",
        output=f"bench-recs-{tag}",
        dlq=f"bench-dlq-{tag}",
        partitions=partitions or settings.topics.partitions,
        replication_factor=settings.topics.replication_factor,
    )
    return topics, tag


def child_env(topics: TopicsSettings, group_id: str, **overrides: str) -> dict[str, str]:
    """The environment of a ``streamrank`` child process on ``topics`` with its own group.

    This process's environment (the stack's ``STREAMRANK_*``, ``STREAMRANK_CONFIG``) with the
    topics and the group on top, metrics off unless ``overrides`` say otherwise.

    Args:
        topics: the child's topics.
        group_id: its consumer group.
        overrides: more ``STREAMRANK_*`` variables, e.g. ``STREAMRANK_METRICS__PORT="9500"``.

    Returns:
        A complete environment for ``subprocess``.
    """
    return {
        **os.environ,
        "STREAMRANK_TOPICS__INPUT": topics.input,
        "STREAMRANK_TOPICS__OUTPUT": topics.output,
        "STREAMRANK_TOPICS__DLQ": topics.dlq,
        "STREAMRANK_TOPICS__PARTITIONS": str(topics.partitions),
        "STREAMRANK_KAFKA__GROUP_ID": group_id,
        "STREAMRANK_METRICS__ENABLED": "false",
        **overrides,
    }


def streamrank_command(*args: str) -> list[str]:
    """``python -m pipeline.cli ARGS`` with this interpreter."""
    return [sys.executable, "-m", "pipeline.cli", *args]


def score_backlog(
    topics: TopicsSettings,
    group_id: str,
    nproc: int = 1,
    idle_s: float = 3.0,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """``streamrank run --nproc N`` over what is on ``topics.input``, until ``idle_s`` idle.

    Args:
        topics: the run's topics (the events already produced).
        group_id: the run's consumer group.
        nproc: ranks.
        idle_s: ``--exit-when-idle``.
        env: more ``STREAMRANK_*`` variables for the run (e.g. the checkpoint it serves).

    Returns:
        Each rank's run summary (the ``ranks`` of the job's merged ``--summary-json``; the
        whole summary alone for one process), rank 0 first.

    Example::

        events_per_s = score_backlog(topics, "bench-1")[0]["events_per_s"]
    """
    with tempfile.TemporaryDirectory() as tmp:
        summary = Path(tmp) / "summary.json"
        cmd = streamrank_command(
            "run",
            "--nproc",
            str(nproc),
            "--exit-when-idle",
            str(idle_s),
            "--summary-json",
            str(summary),
        )
        subprocess.run(
            cmd,
            env=child_env(topics, group_id, **(env or {})),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        job = json.loads(summary.read_text())
        ranks: list[dict[str, Any]] = job.get("ranks", [job])
        return ranks


def create_topics(settings: Settings, config: dict[str, str] | None = None) -> None:
    """Create ``settings.topics`` (input, output, DLQ) with a topic ``config`` for all three.

    Args:
        settings: the cluster and the topics (partitions, replication factor).
        config: topic configuration, e.g. ``{"message.timestamp.type": "LogAppendTime"}``.

    Example::

        create_topics(run_settings, {"message.timestamp.type": "LogAppendTime"})
    """
    topics = settings.topics
    admin = make_admin(settings.kafka.config, log_level=4)  # no info lines
    new = [
        NewTopic(name, topics.partitions, topics.replication_factor, config=config or {})
        for name in (topics.input, topics.output, topics.dlq)
    ]
    for future in admin.create_topics(new, operation_timeout=15).values():
        future.result()


def delete_run_topics(settings: Settings) -> None:
    """Delete ``settings.topics`` (input, output, DLQ) (:func:`delete_topics`).

    Args:
        settings: the cluster and the topics.
    """
    topics = settings.topics
    delete_topics(settings, [topics.input, topics.output, topics.dlq])


def record_count(settings: Settings, topic: str) -> int:
    """How many records ``topic`` holds (high minus low watermark, summed over partitions).

    Args:
        settings: the cluster.
        topic: a topic without transactional markers (every offset is a record).
    """
    consumer = make_consumer(settings.kafka.config, group_id=f"bench-count-{uuid.uuid4().hex[:8]}")
    try:
        metadata = consumer.list_topics(topic, timeout=15).topics[topic]
        total = 0
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=15)
            total += high - low
        return total
    finally:
        consumer.close()


def seeded_world(settings: Settings) -> SyntheticWorld:
    """The configured synthetic world, its features written to the configured Redis first."""
    world = build_world(settings)
    writer = FeatureStoreWriter(redis_client(settings), settings.redis.key_prefix)
    seed_world_features(world, writer)
    return world


def time_forward_rows(scorer: Scorer, inputs: list[ModelInput], seconds: float) -> float:
    """Rows per second scoring ``inputs`` in turn for about ``seconds`` (after one warm pass).

    Times exactly what the pipeline's forward stage runs: :meth:`Scorer.forward`.

    Args:
        scorer: the model under test.
        inputs: prepared batches, scored in turn.
        seconds: how long to measure.

    Returns:
        Rows scored per second.
    """
    for inp in inputs:
        scorer.forward(inp)
    synchronize(scorer.device)
    rows = calls = 0
    start = time.perf_counter()
    while True:
        inp = inputs[calls % len(inputs)]
        scorer.forward(inp)
        rows += inp.num_rows
        calls += 1
        if time.perf_counter() - start >= seconds:
            synchronize(scorer.device)  # a GPU may still be running what was queued
            return rows / (time.perf_counter() - start)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
