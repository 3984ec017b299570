"""Benchmark input for a configured model (``[model.module]``): its events synthesized from its
own schema, its Redis records from its own layouts, and its module untrained.

``bench overhead`` with such a configuration measures the configured path (fastavro decode, the
configured enricher, the mapped features) on the same terms as the built-in one: a run of the
two configurations, interleaved, gives the ratio the issue's goal is about.

Records: every field gets a value of its type (nested records, nullable unions null one time in
five, arrays of 0-5 items, strings from a vocabulary of 20, timestamps now); then the roles get
realistic ones (a unique event id, a user among ``users``, 2-12 candidates among ``items``, a
small result count). Ids of ``identity`` keys that dead-letter outside ids are kept inside
their tables, and a weighted key's weights (event arrays, Redis ``weights`` fields) get one
value per id, so that every event is scored.

Example::

    version = configured_checkpoint(settings, scratch)
    produce_configured_events(settings, events=20_000)
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import redis
import torch

from model.features.mapping import FeatureMap, RecordKind, RecordLayout
from model.module.factory import build_module
from model.module.store import import_state_dict
from model.store.versions import ModelVersions
from pipeline.connectors.avro.reference import RecordCodec
from pipeline.connectors.avro.schema_fields import SchemaField
from pipeline.connectors.kafka.clients import make_producer, produce
from pipeline.connectors.redis.layout import write_hashes
from pipeline.models.preflight import configured_module
from pipeline.settings.features import OutOfRange, RecordFormat, Source, Transform
from pipeline.settings.loading import Settings
from pipeline.tools.bench.common import seeded_world
from pipeline.tools.synthetic_io import produce_events

__all__ = [
    "CONFIGURED_MODEL",
    "configured_checkpoint",
    "produce_configured_events",
    "seed_layouts",
    "synthetic_records",
]

USERS = 5_000
ITEMS = 10_000
_VOCABULARY = tuple(f"value-{i}" for i in range(20))


CONFIGURED_MODEL = (
    "the trained model: the configured module untrained (seed 0), served as a version of its "
    "own (its forward is not counted as non-model CPU)",
    "model watching: the untrained version is a plain checkpoint",
)
"""What a benchmark of a configured model changes, and why."""


def configured_checkpoint(settings: Settings, directory: Path) -> Path:
    """The configured module, untrained (seed 0), imported as a version under ``directory``.

    Returns:
        The version's directory (serve it with :func:`pipeline.tools.bench.served.serving`).
    """
    config, _ = configured_module(settings)
    weights = directory / "untrained.pt"
    torch.save(build_module(config, "cpu", seed=0).state_dict(), weights)
    versions = ModelVersions.create(directory / "versions")
    import_state_dict(config, weights, versions, "untrained", promote=True)
    return versions.current_path()


def _value(node: Any, named: dict[str, Any], rng: np.random.Generator, now_ms: int) -> Any:
    """A random value of the Avro type ``node`` (parsed schema)."""
    node = named.get(node, node) if isinstance(node, str) else node
    if isinstance(node, list):
        branches = [b for b in node if b != "null"]
        if len(branches) < len(node) and rng.random() < 0.2:
            return None
        return _value(branches[int(rng.integers(0, len(branches)))], named, rng, now_ms)
    kind = node if isinstance(node, str) else node["type"]
    if isinstance(node, dict) and node.get("logicalType", "").startswith("timestamp"):
        return now_ms
    if kind in ("long", "int"):
        return int(rng.integers(0, 1000))
    if kind in ("float", "double"):
        return float(rng.random())
    if kind == "boolean":
        return bool(rng.random() < 0.5)
    if kind == "string":
        return _VOCABULARY[int(rng.integers(0, len(_VOCABULARY)))]
    if kind in ("bytes", "fixed"):
        return bytes(int(node.get("size", 4)) if isinstance(node, dict) else 4)
    if kind == "enum":
        return node["symbols"][int(rng.integers(0, len(node["symbols"])))]
    if kind == "array":
        return [_value(node["items"], named, rng, now_ms) for _ in range(rng.integers(0, 6))]
    if kind == "map":
        return {}
    return {f["name"]: _value(f["type"], named, rng, now_ms) for f in node["fields"]}


def _put(record: dict[str, Any], field: SchemaField, value: Any) -> None:
    node = record
    for part in field.path[:-1]:
        node = node[part]
    node[field.path[-1]] = value


def synthetic_records(fmap: FeatureMap, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` records of the map's schema (module docstring)."""
    rng = np.random.default_rng(seed)
    now_ms = int(time.time() * 1000)
    named = dict(fmap.schema.get("__named_schemas", {}))
    roles = fmap.roles
    items = min([ITEMS] + [k.num_rows for k in fmap.sparse if _keeps_inside(k, Source.CANDIDATE)])
    inside = [
        (k, f) for k in fmap.sparse if _keeps_inside(k, Source.EVENT)
        for f in fmap.event_fields if f.store is k.store and f.column == k.column
    ]  # fmt: skip
    records = []
    for _ in range(n):
        record = _value(fmap.schema, named, rng, now_ms)
        _put(record, roles.event_id, uuid.uuid4().hex)
        _put(record, roles.user_id, int(rng.integers(0, USERS)))
        count = int(rng.integers(2, 13))
        _put(record, roles.candidates, [int(i) for i in rng.choice(items, count, replace=False)])
        _put(record, roles.event_time, now_ms)
        if roles.num_results is not None:
            _put(record, roles.num_results, int(rng.integers(1, 6)))
        for field in fmap.event_fields:  # one weight per id
            ids = field.field.read(record)
            if field.weights is not None and ids is not None:
                _put(record, field.weights, [float(w) for w in rng.random(len(ids))])
        for key, field in inside:
            held = field.field.read(record)
            if held is not None:
                kept = (
                    [v % key.num_rows for v in held]
                    if isinstance(held, list)
                    else held % key.num_rows
                )
                _put(record, field.field, kept)
        records.append(record)
    return records


def _keeps_inside(key: Any, source: Source) -> bool:
    return (
        key.source is source
        and key.transform is Transform.IDENTITY
        and key.out_of_range is OutOfRange.DLQ
    )


def _seed(client: redis.Redis, layout: RecordLayout | None, ids: range, seed: int) -> None:
    """Random records for ``ids`` in ``layout`` (hashes, or packed bytes)."""
    if layout is None:
        return
    rng = np.random.default_rng(seed)
    values = []
    for _ in ids:
        record: dict[str, Any] = {}
        for f in layout.fields:
            if f.kind is RecordKind.VECTOR:
                record[f.name] = rng.standard_normal(f.width).astype("<f4")
            elif f.kind is RecordKind.ID:
                record[f.name] = int(rng.integers(0, 1000))
            elif f.kind is RecordKind.WEIGHTS:  # after their list: one per id
                paired = next(
                    g for g in layout.fields if g.kind is RecordKind.ID_LIST and g.column == f.pairs
                )
                record[f.name] = rng.random(len(record[paired.name])).astype("<f4")
            else:
                record[f.name] = rng.integers(0, ITEMS, int(rng.integers(0, f.width + 1)))
        values.append(record)
    if layout.format is RecordFormat.HASH:
        write_hashes(client, layout, list(ids), values)
        return
    pipe = client.pipeline(transaction=False)
    for record_id, record in zip(ids, values, strict=True):
        parts = [
            np.asarray(record[f.name], dtype="<f4" if f.kind is RecordKind.VECTOR else "<i8")
            for f in layout.fields
        ]
        pipe.set(layout.key.replace("{id}", str(record_id)), b"".join(p.tobytes() for p in parts))
    pipe.execute()


def seed_layouts(settings: Settings, fmap: FeatureMap, seed: int = 0) -> None:
    """Random records of the map's user and item layouts in Redis: users ``0 .. USERS - 1``,
    items ``0 .. ITEMS - 1`` (the ids :func:`synthetic_records` draws)."""
    client = redis.Redis.from_url(settings.redis.url, **settings.redis.client_kwargs())
    try:
        _seed(client, fmap.user, range(USERS), seed)
        _seed(client, fmap.item, range(ITEMS), seed + 1)
    finally:
        client.close()


def produce_configured_events(settings: Settings, events: int, seed: int = 0) -> None:
    """Seed the layouts' Redis records, then produce ``events`` synthetic records to
    ``settings.topics.input`` in the configured framing.

    On the built-in UserEvent schema (no ``events.schema_file``) the events and the packed
    records are those of the built-in benchmark (the synthetic world): the two paths then
    score identical input."""
    if not settings.events.configured:
        produce_events(settings, seeded_world(settings), events)
        return
    _, fmap = configured_module(settings)
    seed_layouts(settings, fmap, seed)
    codec = RecordCodec(settings.codec, Path(fmap.schema_name), settings.topics.input)
    producer = make_producer(settings.kafka.config)
    for record in synthetic_records(fmap, events, seed):
        produce(producer, settings.topics.input, codec.encode(record))
    if producer.flush(60):
        raise RuntimeError("not every synthetic event was delivered")
