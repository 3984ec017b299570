"""TorchRec's DLRM_DCN (two task columns) over marketplace searches: a model, a schema and a
feature store that streamrank did not write (nothing here imports streamrank).

    python examples/dcn/example.py init        # train briefly in DLRMTrain, write its state_dict
    python examples/dcn/example.py seed        # shoppers' and listings' features, packed bytes
    python examples/dcn/example.py produce --events 200   # SearchRequest events to Kafka

Kafka and Redis come from ``STREAMRANK_KAFKA__BOOTSTRAP_SERVERS`` and ``STREAMRANK_REDIS__URL``
(``source .stack/env``); the topic is ``searches``. See docs/byom.md.
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
from torchrec.models.dlrm import DLRM_DCN, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

HERE = Path(__file__).resolve().parent
SCHEMA = fastavro.parse_schema(json.loads((HERE / "search_request.avsc").read_text()))
STATE_DICT = Path("artifacts/examples/dcn.pt")
TOPIC = "searches"
USER_KEY = "market:shopper:{id}"
ITEM_KEY = "market:listing:{id}"

TABLES = {
    "shopper": 4096,
    "country": 128,
    "device": 3,
    "listing": 3000,
    "terms": 512,
    "category": 40,
    "recent": 3000,
}
DIM = 8
DENSE = 8  # price_ceiling, profile (3), quality (4)
SHOPPERS = 800
LISTINGS = 3000
COUNTRIES = ("DE", "FR", "NL", "PL", "SE", "IT")
TERMS = ("lamp", "oak", "desk", "red", "chair", "vintage", "sofa", "linen", "rug", "steel")


def build_model() -> DLRM_DCN:
    """The untrained model: 8-wide tables, a DCN interaction, two task logits."""
    tables = [
        EmbeddingBagConfig(
            name=f"t_{name}", embedding_dim=DIM, num_embeddings=rows, feature_names=[name]
        )
        for name, rows in TABLES.items()
    ]
    return DLRM_DCN(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables),
        dense_in_features=DENSE,
        dense_arch_layer_sizes=[32, DIM],
        over_arch_layer_sizes=[32, 2],
        dcn_num_layers=2,
        dcn_low_rank_dim=8,
    )


def _training_batch(
    rng: np.random.Generator, rows: int
) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """Synthetic training rows shaped like served ones (price ceiling or 0, profile, quality;
    random ids) and two labels, click and purchase, drawn from logistics of the dense
    features."""
    lengths = [np.ones(rows, dtype=np.int64) for _ in TABLES]
    lengths[4] = rng.integers(0, 5, rows)  # terms
    lengths[6] = rng.integers(0, 7, rows)  # recent
    pairs = zip(TABLES.values(), lengths, strict=True)
    values = [rng.integers(0, size, int(n.sum())) for size, n in pairs]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=list(TABLES),
        values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(np.concatenate(lengths)),
    )
    price = np.where(rng.random(rows) < 0.4, 0.0, rng.uniform(0.05, 5.0, rows))
    dense = np.hstack([price[:, None], rng.standard_normal((rows, 3)), rng.random((rows, 4))])
    click = dense[:, 1] + 2 * (dense[:, 4] - 0.5)
    purchase = click - 0.5 * price - 1
    labels = rng.random((rows, 2)) < 1 / (1 + np.exp(-np.stack([click, purchase], axis=1)))
    return (
        torch.from_numpy(dense.astype(np.float32)),
        kjt,
        torch.from_numpy(labels.astype(np.float32)),
    )


def init(out: Path, steps: int = 60, seed_: int = 0) -> None:
    """Train on synthetic clicks and purchases, then save the DLRMTrain wrapper's state_dict
    (its keys start with ``model.``: streamrank.toml strips that prefix)."""
    torch.manual_seed(seed_)
    rng = np.random.default_rng(seed_)
    train = DLRMTrain(build_model())
    optimizer = torch.optim.Adam(train.parameters(), lr=0.01)
    for _ in range(steps):
        dense, sparse, labels = _training_batch(rng, 256)
        logits = train.model(dense, sparse)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(train.state_dict(), out)
    print(f"wrote {out} (final loss {loss.item():.3f})")


def shopper_features(shopper: int) -> tuple[np.ndarray, list[int]]:
    """A shopper's profile (3 values) and recently viewed listings (up to 8, newest first)."""
    rng = np.random.default_rng(shopper)
    recent = rng.integers(0, LISTINGS, int(rng.integers(0, 9)))
    return rng.standard_normal(3).astype("<f4"), [int(r) for r in recent]


def listing_features(listing: int) -> tuple[int, np.ndarray]:
    """A listing's category (a raw id) and quality signals (4 values)."""
    rng = np.random.default_rng(50_000 + listing)
    return int(rng.integers(0, 10**6)), rng.random(4).astype("<f4")


def seed(client: redis.Redis, user_key: str = USER_KEY, item_key: str = ITEM_KEY) -> None:
    """Every shopper's and listing's features, packed little-endian: a shopper is
    ``float32[3]`` then ``int64[n]``; a listing ``int64`` then ``float32[4]``."""
    pipe = client.pipeline(transaction=False)
    for shopper in range(SHOPPERS):
        profile, recent = shopper_features(shopper)
        value = profile.tobytes() + np.asarray(recent, dtype="<i8").tobytes()
        pipe.set(user_key.replace("{id}", str(shopper)), value)
    for listing in range(LISTINGS):
        category, quality = listing_features(listing)
        value = np.int64(category).astype("<i8").tobytes() + quality.tobytes()
        pipe.set(item_key.replace("{id}", str(listing)), value)
    pipe.execute()
    print(f"seeded {SHOPPERS} shoppers and {LISTINGS} listings")


def events(n: int, seed_: int = 0) -> list[dict[str, Any]]:
    """``n`` SearchRequest records (some shoppers without features, some without a price)."""
    rng = np.random.default_rng(seed_)
    now = int(time.time() * 1000)
    devices = ("IOS", "ANDROID", "WEB")
    out = []
    for _ in range(n):
        listings = rng.choice(LISTINGS, int(rng.integers(2, 15)), replace=False)
        terms = rng.choice(len(TERMS), int(rng.integers(0, 6)), replace=False)
        out.append(
            {
                "request_id": f"search-{uuid.uuid4().hex[:12]}",
                "session": {
                    "shopper_id": int(rng.integers(0, SHOPPERS + 80)),
                    "country": COUNTRIES[int(rng.integers(0, len(COUNTRIES)))],
                    "device": devices[int(rng.integers(0, 3))],
                },
                "sent_at_ms": now,
                "listing_ids": [int(x) for x in listings],
                "query_terms": [TERMS[int(t)] for t in terms],
                "price_ceiling": None if rng.random() < 0.4 else float(rng.uniform(0.05, 5.0)),
                "want": int(rng.integers(1, 6)),
            }
        )
    return out


def encode(record: dict[str, Any]) -> bytes:
    """One record in schemaless Avro (streamrank's ``codec.framing = "raw"``)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, SCHEMA, record)
    return buf.getvalue()


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    """Send ``records`` to ``topic`` (keyed by shopper)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for record in records:
        producer.produce(topic, encode(record), key=str(record["session"]["shopper_id"]).encode())
        producer.poll(0)
    assert producer.flush(30) == 0, "not every event was delivered"
    print(f"produced {len(records)} searches to {topic}")


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
