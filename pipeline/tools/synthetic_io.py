"""The synthetic world on the real stack: seed its features into Redis, produce its events.

``seed-features``, ``produce`` and ``init-model`` all build the world from the ``[synthetic]``
settings section (plus the model's dense widths), so events, features and training data agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis
from confluent_kafka import Producer

from model.synthetic import SyntheticWorld, WorldConfig, to_event_dicts
from pipeline.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec
from pipeline.config import Settings
from pipeline.feature_store import FeatureStoreWriter
from pipeline.kafka_io import ensure_topics, make_producer, produce
from pipeline.tools.synthetic_settings import synthetic_settings


def build_world(settings: Settings) -> SyntheticWorld:
    """The world described by ``settings.synthetic`` with the model's dense widths.

    Raises:
        ConfigError: ``[synthetic]`` holds an unknown key or a bad value.
    """
    s = synthetic_settings(settings)
    return SyntheticWorld(
        WorldConfig(
            num_users=s.num_users,
            num_items=s.num_items,
            num_categories=s.num_categories,
            seed=s.seed,
            min_candidates=s.min_candidates,
            max_candidates=s.max_candidates,
            user_dense_dim=settings.model.user_dense_dim,
            item_dense_dim=settings.model.item_dense_dim,
        )
    )


def redis_client(settings: Settings) -> redis.Redis:
    """A client of the configured Redis (TLS settings included), without timeouts: bulk
    loads may take a while."""
    return redis.Redis.from_url(settings.redis.url, **settings.redis.client_kwargs())


def seed_world_features(world: SyntheticWorld, writer: FeatureStoreWriter) -> tuple[int, int]:
    """Write every user's and item's features. Returns (users, items) written."""
    recent = [world.stored_recent_item_ids(u) for u in range(world.num_users)]
    users = writer.write_users(world.user_ids, world.user_dense, recent)
    items = writer.write_items(world.item_ids, world.item_category, world.item_dense)
    return users, items


def _read_table(path: Path) -> Any:
    import pyarrow.csv
    import pyarrow.parquet

    if path.suffix in (".parquet", ".pq"):
        return pyarrow.parquet.read_table(path)
    if path.suffix == ".csv":
        return pyarrow.csv.read_csv(path)
    raise ValueError(f"{path}: expected a .csv or .parquet file")


def _dense_columns(table: Any, dim: int, path: Path) -> np.ndarray:
    names = [f"dense_{k}" for k in range(dim)]
    missing = [n for n in names if n not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing columns {missing} (need dense_0..dense_{dim - 1})")
    return np.stack([table.column(n).to_numpy() for n in names], axis=1).astype(np.float32)


def seed_file_features(
    writer: FeatureStoreWriter,
    user_dense_dim: int,
    item_dense_dim: int,
    users_file: Path | None = None,
    items_file: Path | None = None,
) -> tuple[int, int]:
    """Load features from CSV/Parquet files.

    Users file columns: ``user_id``, ``dense_0`` .. ``dense_{D-1}``, optional ``recent`` (item
    ids separated by spaces, newest first). Items file columns: ``item_id``, ``category``,
    ``dense_0`` .. ``dense_{D-1}``.

    Returns:
        (users, items) written.
    """
    users = items = 0
    if users_file is not None:
        table = _read_table(users_file)
        if "user_id" not in table.column_names:
            raise ValueError(f"{users_file}: missing column user_id")
        ids = table.column("user_id").to_numpy().astype(np.int64)
        dense = _dense_columns(table, user_dense_dim, users_file)
        if "recent" in table.column_names:
            recent = [
                [int(x) for x in (text or "").split()]
                for text in table.column("recent").to_pylist()
            ]
        else:
            recent = [[] for _ in range(len(ids))]
        users = writer.write_users(ids, dense, recent)
    if items_file is not None:
        table = _read_table(items_file)
        for column in ("item_id", "category"):
            if column not in table.column_names:
                raise ValueError(f"{items_file}: missing column {column}")
        items = writer.write_items(
            table.column("item_id").to_numpy().astype(np.int64),
            table.column("category").to_numpy().astype(np.int64),
            _dense_columns(table, item_dense_dim, items_file),
        )
    return users, items


@dataclass
class ProducedEvents:
    """What ``produce`` sent: valid event records and the count of malformed messages."""

    records: list[dict[str, Any]]
    malformed: int


MALFORMED_KINDS = ("garbage", "empty", "zero_results", "negative_id", "oversized")
"""An empty ``candidate_item_ids`` is not among them: with ``[retrieval]`` on it is answered."""


def malformed_values(
    codec: RecordCodec, template: dict[str, Any], max_bytes: int
) -> Iterator[bytes]:
    """One bad message of each kind in :data:`MALFORMED_KINDS`, cycling forever."""
    while True:
        yield b"\x07not avro at all\xff\xfe"
        yield b""
        yield codec.encode({**template, "num_results": 0})
        yield codec.encode({**template, "user_id": -42})
        yield codec.encode({**template, "recent_item_ids": [2**50] * (max_bytes // 7 + 16)})


def produce_events(
    settings: Settings,
    world: SyntheticWorld,
    num_events: int,
    *,
    rate: float | None = None,
    seed: int | None = None,
    malformed: int = 0,
    producer: Producer | None = None,
    progress: Callable[[int], None] | None = None,
) -> ProducedEvents:
    """Produce ``num_events`` synthetic UserEvents (and ``malformed`` bad messages among them).

    Args:
        settings: where to produce (``topics.input``) and in which framing.
        world: the synthetic world the events come from.
        num_events: valid events to send.
        rate: events per second (``None``: as fast as possible).
        seed: event sampling seed (``None``: a fresh one, so event ids never repeat).
        malformed: bad messages spread evenly among the events (for the DLQ).
        producer: an existing producer (else one from ``settings.kafka``).
        progress: called with the number of messages sent since the last call.

    Returns:
        The valid records sent (``event_time`` is the send time) and the malformed count.
    """
    ensure_topics(settings.kafka, settings.topics)
    producer = producer or make_producer(settings.kafka)
    codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    rng = np.random.default_rng(seed)
    topic = settings.topics.input
    records: list[dict[str, Any]] = []
    bad_every = (num_events // malformed) if malformed else 0
    bad_values: Iterator[bytes] | None = None
    sent_bad = 0
    started = time.monotonic()
    chunk = 1000
    for start in range(0, num_events, chunk):
        events = world.sample_events(min(chunk, num_events - start), rng)
        for record in to_event_dicts(events, world):
            n = len(records)
            if rate:
                delay = started + n / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            record["event_time"] = int(time.time() * 1000)
            produce(producer, topic, codec.encode(record), key=str(record["user_id"]).encode())
            records.append(record)
            if bad_every and n % bad_every == bad_every - 1 and sent_bad < malformed:
                if bad_values is None:
                    bad_values = malformed_values(codec, record, settings.codec.max_message_bytes)
                produce(producer, topic, next(bad_values))
                sent_bad += 1
            if progress is not None and n % 100 == 99:
                progress(100)
        producer.poll(0)
    remaining = producer.flush(30)
    if remaining:
        raise RuntimeError(f"{remaining} events not delivered to {topic}")
    if progress is not None:
        progress(len(records) % 100)
    return ProducedEvents(records, sent_bad)
