"""TorchRec's SimpleDeepFMNN over page views: a model, a schema and a feature store that
streamrank did not write (nothing here imports streamrank).

    python examples/deepfm/example.py init        # train briefly, write the state_dict
    python examples/deepfm/example.py seed        # viewers' and offers' features: Redis hashes
                                                  # (some viewers without one, some without
                                                  # a segment: trained as empty bags)
    python examples/deepfm/example.py produce --events 200   # PageView events to Kafka

Kafka and Redis come from ``STREAMRANK_KAFKA__BOOTSTRAP_SERVERS`` and ``STREAMRANK_REDIS__URL``
(``source .stack/env``); the topic is ``page-views``. See docs/byom.md.
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
from torchrec.models.deepfm import SimpleDeepFMNN
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

HERE = Path(__file__).resolve().parent
SCHEMA = fastavro.parse_schema(json.loads((HERE / "page_view.avsc").read_text()))
STATE_DICT = Path("artifacts/examples/deepfm.pt")
TOPIC = "page-views"
USER_KEY = "shop:viewer:{id}"
ITEM_KEY = "shop:offer:{id}"

#: The tables, as the model was trained (streamrank.toml declares the same).
TABLES = {"viewer": 1000, "browser": 64, "offer": 2000, "recent_offers": 2000, "segment": 12}
DIM = 16
DENSE = 7  # hour_of_day, taste (4), stats (2)
VIEWERS = 600  # ids 0..599 have features; events also come from 600..699 (no features)
UNSEGMENTED = 10  # every 10th viewer's record (ids 3, 13, ...) has a taste but no segment
OFFERS = 1500
BROWSERS = ("firefox", "chrome", "safari", "edge", "curl")


def build_model() -> SimpleDeepFMNN:
    """The untrained model: one 16-wide table per feature."""
    tables = [
        EmbeddingBagConfig(
            name=f"t_{name}", embedding_dim=DIM, num_embeddings=rows, feature_names=[name]
        )
        for name, rows in TABLES.items()
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    return SimpleDeepFMNN(
        num_dense_features=DENSE,
        embedding_bag_collection=ebc,
        hidden_layer_size=32,
        deep_fm_dimension=8,
    )


def _training_batch(
    rng: np.random.Generator, rows: int
) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """Synthetic training rows shaped like served ones (hour of day, taste, stats; random ids),
    and clicks drawn from a logistic of the dense features.

    A viewer without a feature record has an empty ``segment`` bag and a zero taste, a record
    without a segment an empty ``segment`` bag: the usual KJT meaning of a missing value (a
    sum-pooled zero vector), which is what streamrank.toml serves (``missing = "empty"`` and
    the dense parts' ``default = 0.0``)."""
    has_record = rng.random(rows) < 0.85
    has_segment = has_record & (rng.random(rows) < 0.9)
    lengths = [np.ones(rows, dtype=np.int64) for _ in TABLES]
    lengths[3] = rng.integers(0, 6, rows)
    lengths[4] = has_segment.astype(np.int64)
    pairs = zip(TABLES.values(), lengths, strict=True)
    values = [rng.integers(0, rows_, int(n.sum())) for rows_, n in pairs]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=list(TABLES),
        values=torch.from_numpy(np.concatenate(values)),
        lengths=torch.from_numpy(np.concatenate(lengths)),
    )
    hour = rng.integers(0, 24, (rows, 1))
    taste = rng.standard_normal((rows, 4)) * has_record[:, None]
    dense = np.hstack([hour, taste, rng.random((rows, 2))])
    logit = 0.1 * (hour[:, 0] - 12) + dense[:, 1] + 2 * (dense[:, 5] - 0.5)
    clicks = rng.random(rows) < 1 / (1 + np.exp(-logit))
    return torch.from_numpy(dense.astype(np.float32)), kjt, torch.from_numpy(clicks).float()


def init(out: Path, steps: int = 60, seed_: int = 0) -> None:
    """Train on synthetic clicks for a few steps and save ``model.state_dict()``."""
    torch.manual_seed(seed_)
    rng = np.random.default_rng(seed_)
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        dense, sparse, clicks = _training_batch(rng, 256)
        loss = torch.nn.functional.binary_cross_entropy(model(dense, sparse).squeeze(1), clicks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    print(f"wrote {out} (final loss {loss.item():.3f})")


def viewer_features(viewer: int) -> dict[str, Any]:
    """A viewer's record: a 4-value taste vector and a segment id (0..11); every
    ``UNSEGMENTED``-th viewer has no segment yet."""
    rng = np.random.default_rng(viewer)
    record: dict[str, Any] = {"taste": rng.standard_normal(4).astype("<f4")}
    segment = int(rng.integers(0, 12))
    if viewer % UNSEGMENTED != 3:
        record["segment"] = segment
    return record


def offer_features(offer: int) -> dict[str, Any]:
    """An offer's record: price and rating, two values."""
    rng = np.random.default_rng(10_000 + offer)
    return {"stats": rng.random(2).astype("<f4")}


def seed(client: redis.Redis, user_key: str = USER_KEY, item_key: str = ITEM_KEY) -> None:
    """Every viewer's and offer's features as Redis hashes (vectors: float32 LE bytes, ids
    decimal); a viewer without a segment has no ``segment`` field."""
    pipe = client.pipeline(transaction=False)
    for viewer in range(VIEWERS):
        record = viewer_features(viewer)
        mapping = {"taste": record["taste"].tobytes()}
        if "segment" in record:
            mapping["segment"] = str(record["segment"]).encode()
        pipe.hset(user_key.replace("{id}", str(viewer)), mapping=mapping)
    for offer in range(OFFERS):
        stats = offer_features(offer)["stats"]
        pipe.hset(item_key.replace("{id}", str(offer)), mapping={"stats": stats.tobytes()})
    pipe.execute()
    print(f"seeded {VIEWERS} viewers and {OFFERS} offers")


def events(n: int, seed_: int = 0) -> list[dict[str, Any]]:
    """``n`` PageView records (some viewers without features, some with no slot count)."""
    rng = np.random.default_rng(seed_)
    now = int(time.time() * 1000)
    out = []
    for _ in range(n):
        offers = rng.choice(OFFERS, int(rng.integers(3, 12)), replace=False)
        out.append(
            {
                "view_id": uuid.uuid4().hex,
                "viewer": {
                    "id": int(rng.integers(0, VIEWERS + 100)),
                    "browser": BROWSERS[int(rng.integers(0, len(BROWSERS)))],
                },
                "viewed_at": now,
                "offer_ids": [int(o) for o in offers],
                "recent_offer_ids": [int(o) for o in rng.integers(0, OFFERS, rng.integers(0, 8))],
                "hour_of_day": int(rng.integers(0, 24)),
                "slots": None if rng.random() < 0.3 else int(rng.integers(1, 4)),
            }
        )
    return out


def encode(record: dict[str, Any]) -> bytes:
    """One record in schemaless Avro (streamrank's ``codec.framing = "raw"``)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, SCHEMA, record)
    return buf.getvalue()


def produce(bootstrap: str, topic: str, records: list[dict[str, Any]]) -> None:
    """Send ``records`` to ``topic`` (keyed by viewer)."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for record in records:
        producer.produce(topic, encode(record), key=str(record["viewer"]["id"]).encode())
        producer.poll(0)
    assert producer.flush(30) == 0, "not every event was delivered"
    print(f"produced {len(records)} page views to {topic}")


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
