"""TorchRec's DLRM over a news feed, with weighted features: a model, a schema and a feature
store that streamrank did not write (nothing here imports streamrank).

Two keys carry a weight per id, summed by an ``is_weighted`` EmbeddingBagCollection: the topics
read this session, weighted by the minutes spent on each (a float array beside the ids in the
event), and the authors a reader follows, weighted by how strongly (a ``weights`` field beside
the id list in the reader's Redis hash).

    python examples/weighted/example.py init       # train briefly, write the state_dict
    python examples/weighted/example.py seed       # readers' and articles' features: hashes
    python examples/weighted/example.py produce --events 200   # FeedRequest events to Kafka

Kafka and Redis come from ``STREAMRANK_KAFKA__BOOTSTRAP_SERVERS`` and ``STREAMRANK_REDIS__URL``
(``source .stack/env``); the topic is ``feed-requests``. See docs/byom.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import redis
import torch
from confluent_kafka import Producer
from torchrec.models.dlrm import DLRM
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

HERE = Path(__file__).resolve().parent
SCHEMA = fastavro.parse_schema(json.loads((HERE / "feed_request.avsc").read_text()))
STATE_DICT = Path("artifacts/examples/weighted.pt")
TOPIC = "feed-requests"
USER_KEY = "feed:reader:{id}"
ITEM_KEY = "feed:article:{id}"

#: Table of each key, and its rows (streamrank.toml declares the same).
TABLES = {
    "reader": ("t_reader", 2000),
    "country": ("t_country", 64),
    "topics": ("t_topic", 300),
    "follows": ("t_author", 1000),
    "article": ("t_article", 4000),
    "section": ("t_section", 16),
}
WEIGHTED = ("topics", "follows")  # the keys whose ids carry a weight; the others weigh 1.0
DIM = 8
DENSE = 6  # profile (4), quality (2)
READERS = 500  # ids 0..499 have features; events also come from 500..599 (no record)
ARTICLES = 3000
TOPICS = 400
AUTHORS = 1200
FOLLOWS = 8  # the id_list's cap (follows = "id_list:8")
COUNTRIES = ("DE", "FR", "NL", "PL", "SE", "IT")


def build_model() -> DLRM:
    """The untrained model: a weighted EmbeddingBagCollection of 8-wide tables."""
    tables = [
        EmbeddingBagConfig(name=table, embedding_dim=DIM, num_embeddings=rows, feature_names=[key])
        for key, (table, rows) in TABLES.items()
    ]
    return DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, is_weighted=True),
        dense_in_features=DENSE,
        dense_arch_layer_sizes=[16, DIM],
        over_arch_layer_sizes=[16, 1],
    )


def _training_batch(
    rng: np.random.Generator, rows: int
) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """Synthetic training rows shaped like served ones (profile, quality; random ids, the
    weighted keys' ids with positive weights, the others weighing 1.0) and clicks drawn from a
    logistic of the dense features and the minutes read."""
    lengths = {key: np.ones(rows, dtype=np.int64) for key in TABLES}
    lengths["topics"] = rng.integers(0, 7, rows)
    lengths["follows"] = rng.integers(0, FOLLOWS + 1, rows)
    values, weights = [], []
    for key, (_, table_rows) in TABLES.items():
        n = int(lengths[key].sum())
        values.append(rng.integers(0, table_rows, n))
        weights.append(rng.gamma(2.0, 1.5, n) if key in WEIGHTED else np.ones(n))
    kjt = KeyedJaggedTensor(
        keys=list(TABLES),
        values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(np.concatenate(list(lengths.values()))),
        weights=torch.from_numpy(np.concatenate(weights).astype(np.float32)),
    )
    dense = rng.standard_normal((rows, DENSE))
    topic_row = np.repeat(np.arange(rows), lengths["topics"])
    minutes = np.bincount(topic_row, weights=weights[2], minlength=rows)
    logit = dense[:, 0] + 0.5 * dense[:, 4] + 0.1 * (minutes - 3)
    clicks = rng.random(rows) < 1 / (1 + np.exp(-logit))
    return torch.from_numpy(dense.astype(np.float32)), kjt, torch.from_numpy(clicks).float()


def init(out: Path, steps: int = 60, seed_: int = 0) -> None:
    """Train on synthetic clicks for a few steps and save ``model.state_dict()``."""
    torch.manual_seed(seed_)
    rng = np.random.default_rng(seed_)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss = torch.zeros(())
    for _ in range(steps):
        dense, sparse, clicks = _training_batch(rng, 256)
        logits = model(dense, sparse).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    print(f"wrote {out} (final loss {loss.item():.3f})")


def reader_features(reader: int) -> dict[str, Any]:
    """A reader's record: a profile, the authors followed and how strongly. Every 7th reader
    (ids 3, 10, ...) has a strength list one short of its follows (a broken pair: served as no
    follows), every 11th (ids 5, 16, ...) follows nobody (no follows field)."""
    rng = np.random.default_rng(reader)
    record: dict[str, Any] = {"profile": rng.standard_normal(4).astype("<f4")}
    if reader % 11 == 5:
        return record
    follows = rng.integers(0, AUTHORS, int(rng.integers(1, FOLLOWS + 1)))
    strength = rng.gamma(2.0, 1.0, len(follows)).astype("<f4")
    record["follows"] = follows.astype("<i8")
    record["follow_strength"] = strength[:-1] if reader % 7 == 3 else strength
    return record


def article_features(article: int) -> dict[str, Any]:
    """An article's record: quality (two values) and its section (0..15)."""
    rng = np.random.default_rng(20_000 + article)
    return {"quality": rng.random(2).astype("<f4"), "section": int(rng.integers(0, 16))}


def seed(client: redis.Redis, user_key: str = USER_KEY, item_key: str = ITEM_KEY) -> None:
    """Every reader's and article's features as Redis hashes (vectors and weights: float32 LE
    bytes, id lists int64 LE bytes, ids decimal)."""
    pipe = client.pipeline(transaction=False)
    for reader in range(READERS):
        record = reader_features(reader)
        mapping = {name: value.tobytes() for name, value in record.items()}
        pipe.hset(user_key.replace("{id}", str(reader)), mapping=mapping)
    for article in range(ARTICLES):
        record = article_features(article)
        mapping = {"quality": record["quality"].tobytes(), "section": str(record["section"])}
        pipe.hset(item_key.replace("{id}", str(article)), mapping=mapping)
    pipe.execute()
    print(f"seeded {READERS} readers and {ARTICLES} articles")


def events(n: int, seed_: int = 0) -> list[dict[str, Any]]:
    """``n`` FeedRequest records: each topic read with the minutes spent on it (float32)."""
    rng = np.random.default_rng(seed_)
    now = int(time.time() * 1000)
    out = []
    for _ in range(n):
        topics = rng.integers(0, TOPICS, int(rng.integers(0, 9)))
        minutes = np.round(rng.gamma(2.0, 1.5, len(topics)), 2).astype(np.float32)
        out.append(
            {
                "request_id": uuid.uuid4().hex,
                "reader": {
                    "id": int(rng.integers(0, READERS + 100)),
                    "country": COUNTRIES[int(rng.integers(0, len(COUNTRIES)))],
                },
                "sent_at": now,
                "topics": [int(t) for t in topics],
                "topic_minutes": [float(m) for m in minutes],
                "article_ids": [
                    int(a) for a in rng.choice(ARTICLES, int(rng.integers(3, 12)), replace=False)
                ],
                "want": None if rng.random() < 0.3 else int(rng.integers(1, 4)),
            }
        )
    return out


def encode(record: dict[str, Any]) -> bytes:
    """One record in schemaless Avro (streamrank's ``codec.framing = "raw"``)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, SCHEMA, record)
    return buf.getvalue()


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    """Send ``records`` to ``topic`` (keyed by reader)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for record in records:
        producer.produce(topic, encode(record), key=str(record["reader"]["id"]).encode())
        producer.poll(0)
    assert producer.flush(30) == 0, "not every event was delivered"
    print(f"produced {len(records)} feed requests to {topic}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    init_cmd = sub.add_parser("init")
    init_cmd.add_argument("--out", type=Path, default=STATE_DICT)
    init_cmd.add_argument("--seed", type=int, default=0)
    sub.add_parser("seed")
    send = sub.add_parser("produce")
    send.add_argument("--events", type=int, default=200)
    send.add_argument("--topic", default=TOPIC)
    args = parser.parse_args()
    if args.command == "init":
        init(args.out, seed_=args.seed)
    elif args.command == "seed":
        seed(redis.Redis.from_url(os.environ.get("STREAMRANK_REDIS__URL", "redis://127.0.0.1")))
    else:
        bootstrap = os.environ.get("STREAMRANK_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9092")
        produce(bootstrap, args.topic, events(args.events, seed_=int(time.time())))


if __name__ == "__main__":
    main()
