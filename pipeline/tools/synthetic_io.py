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
from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec
from pipeline.connectors.kafka.clients import ensure_topics, make_producer, produce
from pipeline.connectors.redis.feature_store import FeatureStoreWriter
from pipeline.settings.loading import Settings
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


class FeatureFileError(ValueError):
    """A users or items file that cannot be loaded: unreadable, a column missing or not numeric.

    Args:
        which: ``"users"`` or ``"items"`` (the ``seed-features`` option is ``--<which>``).
        message: what is wrong with the file and what it needs.

    Example::

        raise FeatureFileError("users", "u.csv: missing column user_id")
    """

    def __init__(self, which: str, message: str) -> None:
        super().__init__(message)
        self.which = which


def _needed_columns(which: str, dim: int) -> str:
    dense = f"dense_0..dense_{dim - 1}"
    if which == "users":
        return f"user_id, {dense} and optionally recent"
    return f"item_id, category, {dense}"


def _read_table(path: Path, which: str) -> Any:
    import pyarrow
    import pyarrow.csv
    import pyarrow.parquet

    try:
        if path.suffix in (".parquet", ".pq"):
            return pyarrow.parquet.read_table(path)
        if path.suffix == ".csv":
            return pyarrow.csv.read_csv(path)
    except (pyarrow.ArrowException, OSError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise FeatureFileError(which, f"{path}: cannot be read: {first_line}") from error
    raise FeatureFileError(which, f"{path}: expected a .csv or .parquet file")


def _require_columns(table: Any, which: str, path: Path, dim: int, names: list[str]) -> None:
    missing = [n for n in names if n not in table.column_names]
    if missing:
        raise FeatureFileError(
            which,
            f"{path}: missing column(s) {', '.join(missing)} "
            f"({which} files have {_needed_columns(which, dim)})",
        )


def _numbers(table: Any, names: list[str], dtype: Any, which: str, path: Path) -> np.ndarray:
    """The columns ``names`` as one ``dtype`` array (rows x len(names)); nulls or text are an
    error naming the column."""
    columns = []
    for name in names:
        column = table.column(name)
        if column.null_count:
            raise FeatureFileError(which, f"{path}: column {name} has empty values")
        try:
            columns.append(np.asarray(column.to_numpy(), dtype=dtype))
        except (ValueError, TypeError) as error:
            raise FeatureFileError(
                which, f"{path}: column {name} is not numeric ({error})"
            ) from error
    return np.stack(columns, axis=1)


@dataclass
class FeatureFiles:
    """Users and items read from files, checked, not yet written (:func:`read_feature_files`)."""

    user_ids: np.ndarray
    user_dense: np.ndarray
    user_recent: list[list[int]]
    item_ids: np.ndarray
    item_category: np.ndarray
    item_dense: np.ndarray


def _read_users(path: Path, dim: int) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    table = _read_table(path, "users")
    dense_names = [f"dense_{k}" for k in range(dim)]
    _require_columns(table, "users", path, dim, ["user_id", *dense_names])
    ids = _numbers(table, ["user_id"], np.int64, "users", path)[:, 0]
    dense = _numbers(table, dense_names, np.float32, "users", path)
    if "recent" not in table.column_names:
        return ids, dense, [[] for _ in range(len(ids))]
    try:
        recent = [
            [int(x) for x in str(text or "").split()] for text in table.column("recent").to_pylist()
        ]
    except ValueError as error:
        raise FeatureFileError(
            "users", f"{path}: column recent holds a non-integer id ({error})"
        ) from error
    return ids, dense, recent


def _read_items(path: Path, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    table = _read_table(path, "items")
    dense_names = [f"dense_{k}" for k in range(dim)]
    _require_columns(table, "items", path, dim, ["item_id", "category", *dense_names])
    keys = _numbers(table, ["item_id", "category"], np.int64, "items", path)
    return keys[:, 0], keys[:, 1], _numbers(table, dense_names, np.float32, "items", path)


def read_feature_files(
    user_dense_dim: int,
    item_dense_dim: int,
    users_file: Path | None = None,
    items_file: Path | None = None,
) -> FeatureFiles:
    """Read and check the users and items files (nothing is written yet).

    Users file columns: ``user_id``, ``dense_0`` .. ``dense_{D-1}``, optional ``recent`` (item
    ids separated by spaces, newest first). Items file columns: ``item_id``, ``category``,
    ``dense_0`` .. ``dense_{D-1}``. CSV or Parquet.

    Args:
        user_dense_dim: D of the users file (``model.user_dense_dim``).
        item_dense_dim: D of the items file (``model.item_dense_dim``).
        users_file: the users file, if any.
        items_file: the items file, if any.

    Returns:
        The rows of both files (empty arrays for a file not given).

    Raises:
        FeatureFileError: a file cannot be read, lacks a column or holds a non-numeric value.

    Example::

        files = read_feature_files(4, 4, Path("users.csv"), Path("items.parquet"))
    """
    users: tuple[np.ndarray, np.ndarray, list[list[int]]] = (
        np.zeros(0, np.int64),
        np.zeros((0, user_dense_dim), np.float32),
        [],
    )
    items = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, item_dense_dim)))
    if users_file is not None:
        users = _read_users(users_file, user_dense_dim)
    if items_file is not None:
        items = _read_items(items_file, item_dense_dim)
    return FeatureFiles(*users, *items)


def write_feature_files(writer: FeatureStoreWriter, files: FeatureFiles) -> tuple[int, int]:
    """Write what :func:`read_feature_files` read. Returns (users, items) written."""
    users = items = 0
    if len(files.user_ids):
        users = writer.write_users(files.user_ids, files.user_dense, files.user_recent)
    if len(files.item_ids):
        items = writer.write_items(files.item_ids, files.item_category, files.item_dense)
    return users, items


@dataclass
class ProducedEvents:
    """What ``produce`` sent.

    Attributes:
        records: the valid event records, in order (empty unless kept).
        malformed: malformed messages sent.
        events: valid events sent.
    """

    records: list[dict[str, Any]]
    malformed: int
    events: int


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
    keep_records: bool = True,
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
        keep_records: return every record sent (for an audit). ``streamrank produce`` keeps
            none: a paced run that kept them all made Python's full collections walk a heap
            growing by the second, each a stall of the sender (measured at 1,100 events/s: one
            every ~22.5 s, of 38, 79, 121 and 160 ms), which then sent a burst to catch up.

    Returns:
        The valid records sent (``event_time`` is the send time; none unless
        ``keep_records``), the malformed count and the valid events' count.
    """
    ensure_topics(settings.kafka.config, settings.topics)
    producer = producer or make_producer(settings.kafka.config)
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
        for n, record in enumerate(to_event_dicts(events, world), start):
            if rate:
                delay = started + n / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            record["event_time"] = int(time.time() * 1000)
            produce(producer, topic, codec.encode(record), key=str(record["user_id"]).encode())
            if keep_records:
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
        progress(num_events % 100)
    return ProducedEvents(records, sent_bad, num_events)
