"""A ranker of the user's own over a video home screen, with a sequence feature: a model, a
schema and a feature store that streamrank did not write (nothing here imports streamrank).

The videos a viewer watched last (newest first) are one KJT key, looked up in an
``EmbeddingCollection``: one vector per watched video, unpooled, attended with the candidate
video as the query by the model in ``history_ranker.py``.

    python examples/sequence/example.py init       # train briefly, write the state_dict
    python examples/sequence/example.py seed       # viewers' and videos' features: hashes
    python examples/sequence/example.py produce --events 200   # WatchRequest events to Kafka

Kafka and Redis come from ``STREAMRANK_KAFKA__BOOTSTRAP_SERVERS`` and ``STREAMRANK_REDIS__URL``
(``source .stack/env``); the topic is ``watch-requests``. See docs/byom.md.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import redis
import torch
from confluent_kafka import Producer
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the model's own code, as streamrank.toml's code_dir

from history_ranker import HistoryRanker  # noqa: E402

SCHEMA = fastavro.parse_schema(json.loads((HERE / "watch_request.avsc").read_text()))
STATE_DICT = Path("artifacts/examples/sequence.pt")
TOPIC = "watch-requests"
USER_KEY = "tv:viewer:{id}"
ITEM_KEY = "tv:video:{id}"

#: The pooled tables of each key, and their rows (streamrank.toml declares the same).
POOLED = {"viewer": 2000, "device": 8, "video": 3000, "genre": 24}
HISTORY_ROWS = 3000  # the sequence table of the key "history"
HISTORY = 10  # the most watched videos a request brings (max_ids, history_length)
DIM = 16
DENSE = 5  # taste (3), stats (2)
VIEWERS = 500  # ids 0..499 have features; requests also come from 500..599 (no record)
VIDEOS = 2500
DEVICES = ("TV", "PHONE", "TABLET", "WEB")


def build_model() -> HistoryRanker:
    """The untrained model: four pooled 16-wide tables and the history's sequence table."""
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t_{key}", embedding_dim=DIM, num_embeddings=rows, feature_names=[key]
            )
            for key, rows in POOLED.items()
        ]
    )
    ec = EmbeddingCollection(
        tables=[
            EmbeddingConfig(
                name="t_history",
                embedding_dim=DIM,
                num_embeddings=HISTORY_ROWS,
                feature_names=["history"],
            )
        ]
    )
    return HistoryRanker(ebc, ec, dense_in_features=DENSE, history_length=HISTORY)


def _training_batch(
    rng: np.random.Generator, rows: int
) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """Synthetic training rows shaped like served ones (taste, stats; random ids, histories of
    0 to 10 videos, some genres missing) and clicks that favour a candidate the viewer watched
    before."""
    lengths = [np.ones(rows, dtype=np.int64) for _ in POOLED]
    lengths[3] = (rng.random(rows) < 0.9).astype(np.int64)  # a video without a genre
    history = rng.integers(0, HISTORY + 1, rows)
    values = [
        rng.integers(0, n, int(c.sum())) for n, c in zip(POOLED.values(), lengths, strict=True)
    ]
    watched = rng.integers(0, HISTORY_ROWS, int(history.sum()))
    first = np.r_[0, np.cumsum(history)[:-1]]
    seen = (history > 0) & (rng.random(rows) < 0.5)
    values[2][seen] = watched[first[seen]]  # half the candidates were watched before
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[*POOLED, "history"],
        values=torch.from_numpy(np.concatenate([*values, watched])),
        lengths=torch.from_numpy(np.concatenate([*lengths, history])),
    )
    dense = rng.standard_normal((rows, DENSE))
    logit = 1.5 * seen + dense[:, 0] - 0.5
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


def viewer_features(viewer: int) -> dict[str, Any]:
    """A viewer's record: a taste vector of three values."""
    rng = np.random.default_rng(viewer)
    return {"taste": rng.standard_normal(3).astype("<f4")}


def video_features(video: int) -> dict[str, Any]:
    """A video's record: stats (two values) and its genre (0..23); every 9th video (ids 4, 13,
    ...) has no genre yet."""
    rng = np.random.default_rng(30_000 + video)
    record: dict[str, Any] = {"stats": rng.random(2).astype("<f4")}
    genre = int(rng.integers(0, 24))
    if video % 9 != 4:
        record["genre"] = genre
    return record


def seed(client: redis.Redis, user_key: str = USER_KEY, item_key: str = ITEM_KEY) -> None:
    """Every viewer's and video's features as Redis hashes (vectors float32 LE, ids decimal)."""
    pipe = client.pipeline(transaction=False)
    for viewer in range(VIEWERS):
        taste = viewer_features(viewer)["taste"]
        pipe.hset(user_key.replace("{id}", str(viewer)), mapping={"taste": taste.tobytes()})
    for video in range(VIDEOS):
        record = video_features(video)
        mapping = {"stats": record["stats"].tobytes()}
        if "genre" in record:
            mapping["genre"] = str(record["genre"]).encode()
        pipe.hset(item_key.replace("{id}", str(video)), mapping=mapping)
    pipe.execute()
    print(f"seeded {VIEWERS} viewers and {VIDEOS} videos")


def events(n: int, seed_: int = 0) -> list[dict[str, Any]]:
    """``n`` WatchRequest records: histories of 0 to 14 videos (the first 10 are served)."""
    rng = np.random.default_rng(seed_)
    now = int(time.time() * 1000)
    out = []
    for _ in range(n):
        out.append(
            {
                "request_id": uuid.uuid4().hex,
                "viewer_id": int(rng.integers(0, VIEWERS + 100)),
                "sent_at": now,
                "device": DEVICES[int(rng.integers(0, len(DEVICES)))],
                "watched": [int(v) for v in rng.integers(0, VIDEOS, int(rng.integers(0, 15)))],
                "video_ids": [
                    int(v) for v in rng.choice(VIDEOS, int(rng.integers(3, 12)), replace=False)
                ],
                "rows": int(rng.integers(1, 6)),
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
        producer.produce(topic, encode(record), key=str(record["viewer_id"]).encode())
        producer.poll(0)
    assert producer.flush(30) == 0, "not every event was delivered"
    print(f"produced {len(records)} watch requests to {topic}")


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
