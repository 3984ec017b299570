"""The worked examples (examples/deepfm, dcn, weighted, sequence) set up for a test, and their
scores computed the way a user would check them: from the raw events and the raw Redis values, with
the test's own KeyedJaggedTensor and the module's own forward (no streamrank feature code:
transforms, the string hash, the salted row hash and what a missing value gives are written
out here; streamrank's code only sets the examples up: imports the weights)."""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import redis
import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from model.module.store import import_state_dict
from model.store.versions import ModelVersions
from pipeline.connectors.kafka.clients import make_producer, produce
from pipeline.models.preflight import configured_module
from pipeline.settings.loading import Settings, load_settings
from tests.conftest import REPO_ROOT
from tests.integration.conftest import collect
from tests.support.logs import failure_excerpt

EXAMPLES = REPO_ROOT / "examples"
_MASK = (1 << 64) - 1
SALT = 0x5EED  # features.hash_salt's default, as the examples leave it


def load_example(name: str) -> ModuleType:
    """``examples/<name>/example.py`` as a module (the examples are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / name / "example.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def string_id(text: str) -> int:
    """A string's signed 64-bit id: the first 8 bytes of its BLAKE2b digest, little-endian."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def hashed_row(raw: int, rows: int) -> int:
    """The salted splitmix64 finaliser of ``raw`` (as unsigned 64 bits), mod ``rows``."""
    z = (raw + 0x9E3779B97F4A7C15 * SALT) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) % rows


@dataclass
class Example:
    """One example, configured for a test.

    Attributes:
        name: ``deepfm`` or ``dcn``.
        script: its example.py, imported.
        toml: the test's copy of its streamrank.toml (own Redis keys and checkpoint).
        user_key / item_key: the Redis key templates of the test's copy.
        state_dict: the file its init wrote.
    """

    name: str
    script: ModuleType
    toml: Path
    user_key: str
    item_key: str
    state_dict: Path

    def reference(self, state_dict: Path | None = None) -> nn.Module:
        """The model as its trainer built it, with the saved weights (strict)."""
        model = self.script.build_model()
        state = torch.load(state_dict or self.state_dict, weights_only=True)
        model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
        return model.eval()


def example_settings(ex: Example, base: Settings) -> Settings:
    """The example's TOML with the test's broker, topics, Redis and small batches."""
    return load_settings(
        ex.toml,
        kafka=base.kafka,
        topics=base.topics,
        redis=base.redis,
        batching=base.batching.model_copy(update={"max_batch_rows": 128}),
        metrics=base.metrics,
    )


def prepare_example(
    name: str,
    tmp: Path,
    base: Settings,
    client: redis.Redis,
    prefix: str,
    edits: Sequence[tuple[str, str]] = (),
) -> tuple[Example, Settings]:
    """The example's model imported as the current version of ``tmp/versions``, its features
    seeded under keys of ``prefix``, its settings on the test's stack (``base``); ``edits``:
    changes to its TOML, as :func:`make_example` makes them."""
    versions = tmp / "versions"
    ex = make_example(name, tmp, prefix, versions, edits=edits)
    settings = example_settings(ex, base)
    ex.script.seed(client, ex.user_key, ex.item_key)
    config, _ = configured_module(settings)
    strip = settings.model.module.state_dict_prefix if settings.model.module else ""
    import_state_dict(
        config, ex.state_dict, ModelVersions.create(versions), strip_prefix=strip, promote=True
    )
    return ex, settings


def send(settings: Settings, ex: Example, records: list[dict[str, Any]]) -> None:
    """``records`` encoded by the example, on the input topic."""
    producer = make_producer(settings.kafka.config)
    for record in records:
        produce(producer, settings.topics.input, ex.script.encode(record))
    assert producer.flush(30) == 0


def event_id(record: dict[str, Any]) -> str:
    """The event id a Recommendation echoes (a PageView's view_id, the others' request_id)."""
    return str(record.get("view_id") or record["request_id"])


def make_example(
    name: str,
    tmp: Path,
    prefix: str,
    checkpoint: Path,
    steps: int = 5,
    edits: Sequence[tuple[str, str]] = (),
) -> Example:
    """Initialise the example's model and write the test's copy of its TOML, with each
    ``(old, new)`` of ``edits`` replaced (each must apply)."""
    script = load_example(name)
    state_dict = tmp / f"{name}.pt"
    script.init(state_dict, steps=steps)
    user_key, item_key = f"{prefix}:u:{{id}}", f"{prefix}:i:{{id}}"
    text = (EXAMPLES / name / "streamrank.toml").read_text()
    text = text.replace(f'"{script.USER_KEY}"', f'"{user_key}"')
    text = text.replace(f'"{script.ITEM_KEY}"', f'"{item_key}"')
    text = text.replace('schema_file = "examples/', f'schema_file = "{EXAMPLES}/')
    text = text.replace('code_dir = "examples/', f'code_dir = "{EXAMPLES}/')
    text = text.replace(f'checkpoint = "artifacts/examples/{name}"', f'checkpoint = "{checkpoint}"')
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    toml = tmp / f"{name}.toml"
    toml.write_text(text)
    return Example(name, script, toml, user_key, item_key, state_dict)


def documented_output(name: str = "dcn") -> dict[str, Any]:
    """The ``[output]`` section the example's streamrank.toml documents in its comments (its
    output schema of the user's), as TOML reads it; ``schema_file`` made absolute."""
    lines = (EXAMPLES / name / "streamrank.toml").read_text().splitlines()
    start = lines.index("# [output]")
    block = [line.removeprefix("#").strip() for line in lines[start:] if line.startswith("#")]
    section = tomllib.loads("\n".join(block))["output"]
    section["schema_file"] = str(REPO_ROOT / section["schema_file"])
    return dict(section)


def _kjt(
    keys: list[str],
    bags: list[list[list[int]]],
    weights: dict[str, list[list[float]]] | None = None,
) -> KeyedJaggedTensor:
    """``bags[key][row]``: the ids of one row's bag; ``weights[key][row]``: their weights
    (with ``weights``, every other id weighs 1.0)."""
    lengths = [len(bag) for per_key in bags for bag in per_key]
    values = [v for per_key in bags for bag in per_key for v in bag]
    flat = None
    if weights is not None:
        flat = [
            w
            for key, per_key in zip(keys, bags, strict=True)
            for row, bag in enumerate(per_key)
            for w in (weights[key][row] if key in weights else [1.0] * len(bag))
        ]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64),
        weights=None if flat is None else torch.tensor(flat, dtype=torch.float32),
    )


def _hash_record(client: redis.Redis, key: str) -> dict[bytes, bytes]:
    """The hash at ``key`` ({} when there is none, or the key holds another type)."""
    if client.type(key) != b"hash":
        return {}
    return client.hgetall(key)  # type: ignore[return-value]


def _vector(raw: bytes | None, width: int) -> np.ndarray | None:
    """A ``vector:width`` field: float32 LE, all finite (``None``: missing or malformed)."""
    if raw is None or len(raw) != 4 * width:
        return None
    values = np.frombuffer(raw, "<f4")
    return values if np.isfinite(values).all() else None


def _decimal_id(raw: bytes | None) -> int | None:
    """An ``id`` field: a decimal integer (``None``: missing or malformed)."""
    try:
        return None if not raw else int(raw)
    except ValueError:
        return None


def deepfm_viewer(
    ex: Example, client: redis.Redis, viewer: int
) -> tuple[list[float], list[int], bool]:
    """A viewer's dense part (taste, zeros when absent), ``segment`` bag (identity over 12
    rows, default row 0; empty when absent: ``missing = "empty"``) and whether a field is
    absent (``fallback_features`` lists ``user_features``)."""
    user = _hash_record(client, ex.user_key.replace("{id}", str(viewer)))
    taste = _vector(user.get(b"taste"), 4)
    segment = _decimal_id(user.get(b"segment"))
    bag = [] if segment is None else [segment if 0 <= segment < 12 else 0]
    dense = [0.0] * 4 if taste is None else taste.tolist()
    return dense, bag, taste is None or segment is None


def deepfm_offer(ex: Example, client: redis.Redis, offer: int) -> tuple[list[float], bool]:
    """An offer's dense part (stats, zeros when absent) and whether it is absent."""
    item = _hash_record(client, ex.item_key.replace("{id}", str(offer)))
    stats = _vector(item.get(b"stats"), 2)
    return ([0.0, 0.0], True) if stats is None else (stats.tolist(), False)


def deepfm_inputs(
    ex: Example,
    record: dict[str, Any],
    client: redis.Redis,
    segment_of_miss: list[int] | None = None,
) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """One PageView's rows, as examples/deepfm/streamrank.toml maps them (``segment_of_miss``:
    the bag of a missing segment instead of an empty one, to show what a miss would change)."""
    viewer = record["viewer"]["id"]
    taste, segment, _ = deepfm_viewer(ex, client, viewer)
    if not segment and segment_of_miss is not None:
        segment = segment_of_miss
    bags: list[list[list[int]]] = [[], [], [], [], []]
    dense = []
    for offer in record["offer_ids"]:
        stats, _ = deepfm_offer(ex, client, offer)
        bags[0].append([viewer % 1000])
        bags[1].append([hashed_row(string_id(record["viewer"]["browser"]), 64)])
        bags[2].append([offer % 2000])
        bags[3].append([r % 2000 for r in record["recent_offer_ids"][:5]])
        bags[4].append(segment)
        dense.append([float(record["hour_of_day"]), *taste, *stats])
    keys = ["viewer", "browser", "offer", "recent_offers", "segment"]
    return torch.tensor(dense, dtype=torch.float32), _kjt(keys, bags)


def deepfm_fallbacks(ex: Example, client: redis.Redis, record: dict[str, Any]) -> set[str]:
    """What a PageView's ``fallback_features`` lists: a side with any field absent."""
    out = set()
    if deepfm_viewer(ex, client, record["viewer"]["id"])[2]:
        out.add("user_features")
    if any(deepfm_offer(ex, client, offer)[1] for offer in record["offer_ids"]):
        out.add("item_features")
    return out


def dcn_inputs(
    ex: Example, record: dict[str, Any], client: redis.Redis
) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """One SearchRequest's rows, as examples/dcn/streamrank.toml maps them."""
    session = record["session"]
    raw_user = client.get(ex.user_key.replace("{id}", str(session["shopper_id"])))
    profile, recent = np.zeros(3, np.float32), []
    if raw_user is not None and len(raw_user) >= 12 and (len(raw_user) - 12) % 8 == 0:  # type: ignore[arg-type]
        finite = _vector(raw_user[:12], 3)  # type: ignore[index]
        profile = profile if finite is None else finite
        recent = np.frombuffer(raw_user[12:], "<i8")[:6].tolist()  # type: ignore[index]
    price = record["price_ceiling"]
    bags: list[list[list[int]]] = [[] for _ in range(7)]
    dense = []
    for listing in record["listing_ids"]:
        raw_item = client.get(ex.item_key.replace("{id}", str(listing)))
        category: list[int] = []  # missing: an empty bag (missing = "empty", the default)
        quality = np.zeros(4, np.float32)
        if raw_item is not None and len(raw_item) == 8 + 16:  # type: ignore[arg-type]
            category = [int(np.frombuffer(raw_item[:8], "<i8")[0]) % 40]  # type: ignore[index]
            finite = _vector(raw_item[8:], 4)  # type: ignore[index]
            quality = quality if finite is None else finite
        bags[0].append([hashed_row(session["shopper_id"], 4096)])
        bags[1].append([hashed_row(string_id(session["country"]), 128)])
        bags[2].append([string_id(session["device"]) % 3])
        bags[3].append([listing])
        bags[4].append([hashed_row(string_id(t), 512) for t in record["query_terms"][:4]])
        bags[5].append(category)
        bags[6].append([r if 0 <= r < 3000 else 0 for r in recent])
        dense.append([0.0 if price is None else price, *profile.tolist(), *quality.tolist()])
    keys = ["shopper", "country", "device", "listing", "terms", "category", "recent"]
    return torch.tensor(dense, dtype=torch.float32), _kjt(keys, bags)


def _int_list(raw: bytes | None) -> list[int] | None:
    """An ``id_list`` field: int64 LE (``None``: missing or malformed)."""
    if raw is None or len(raw) % 8:
        return None
    return np.frombuffer(raw, "<i8").tolist()


def weighted_reader(
    ex: Example, client: redis.Redis, reader: int
) -> tuple[list[float], list[int], list[float], bool]:
    """A reader's profile (zeros when absent), ``follows`` bag (modulo 1000, the first 8) and
    its weights: empty unless the id list and its ``follow_strength`` (float32, finite) are
    both there, one weight per id (``missing = "empty"``); and whether a field is absent."""
    user = _hash_record(client, ex.user_key.replace("{id}", str(reader)))
    profile = _vector(user.get(b"profile"), 4)
    follows = _int_list(user.get(b"follows"))
    raw_strength = user.get(b"follow_strength")
    strength = None
    if raw_strength is not None and len(raw_strength) % 4 == 0:
        strength = np.frombuffer(raw_strength, "<f4")
        strength = strength if np.isfinite(strength[:8]).all() else None
    paired = follows is not None and strength is not None and len(follows) == len(strength)
    bag = [a % 1000 for a in follows[:8]] if paired and follows is not None else []
    weights = strength[:8].tolist() if paired and strength is not None else []
    dense = [0.0] * 4 if profile is None else profile.tolist()
    return dense, bag, weights, profile is None or not paired


def weighted_article(
    ex: Example, client: redis.Redis, article: int
) -> tuple[list[float], list[int], bool]:
    """An article's quality (zeros when absent), ``section`` bag (identity over 16, default
    row 0; empty when absent) and whether a field is absent."""
    item = _hash_record(client, ex.item_key.replace("{id}", str(article)))
    quality = _vector(item.get(b"quality"), 2)
    section = _decimal_id(item.get(b"section"))
    bag = [] if section is None else [section if 0 <= section < 16 else 0]
    dense = [0.0, 0.0] if quality is None else quality.tolist()
    return dense, bag, quality is None or section is None


def weighted_inputs(
    ex: Example, record: dict[str, Any], client: redis.Redis
) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """One FeedRequest's rows, as examples/weighted/streamrank.toml maps them: the topics
    weighted by their minutes (float32), the follows by their strength, every other id 1.0."""
    reader = record["reader"]
    profile, follows, strength, _ = weighted_reader(ex, client, reader["id"])
    topics = [t % 300 for t in record["topics"][:6]]
    minutes = np.float32(record["topic_minutes"][:6]).tolist()
    bags: list[list[list[int]]] = [[] for _ in range(6)]
    weights: dict[str, list[list[float]]] = {"topics": [], "follows": []}
    dense = []
    for article in record["article_ids"]:
        quality, section, _ = weighted_article(ex, client, article)
        bags[0].append([hashed_row(reader["id"], 2000)])
        bags[1].append([hashed_row(string_id(reader["country"]), 64)])
        bags[2].append(topics)
        bags[3].append(follows)
        bags[4].append([article % 4000])
        bags[5].append(section)
        weights["topics"].append(minutes)
        weights["follows"].append(strength)
        dense.append([*profile, *quality])
    keys = ["reader", "country", "topics", "follows", "article", "section"]
    return torch.tensor(dense, dtype=torch.float32), _kjt(keys, bags, weights)


def sequence_inputs(
    ex: Example, record: dict[str, Any], client: redis.Redis
) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """One WatchRequest's rows, as examples/sequence/streamrank.toml maps them: the first 10
    watched videos (modulo 3000) are one row's sequence."""
    viewer = _hash_record(client, ex.user_key.replace("{id}", str(record["viewer_id"])))
    taste = _vector(viewer.get(b"taste"), 3)
    history = [v % 3000 for v in record["watched"][:10]]
    bags: list[list[list[int]]] = [[] for _ in range(5)]
    dense = []
    for video in record["video_ids"]:
        item = _hash_record(client, ex.item_key.replace("{id}", str(video)))
        stats = _vector(item.get(b"stats"), 2)
        genre = _decimal_id(item.get(b"genre"))
        bags[0].append([hashed_row(record["viewer_id"], 2000)])
        bags[1].append([hashed_row(string_id(record["device"]), 8)])
        bags[2].append([video % 3000])
        bags[3].append([] if genre is None else [genre if 0 <= genre < 24 else 0])
        bags[4].append(history)
        dense.append(
            [
                *([0.0] * 3 if taste is None else taste.tolist()),
                *([0.0] * 2 if stats is None else stats.tolist()),
            ]
        )
    keys = ["viewer", "device", "video", "genre", "history"]
    return torch.tensor(dense, dtype=torch.float32), _kjt(keys, bags)


_INPUTS = {
    "deepfm": deepfm_inputs,
    "dcn": dcn_inputs,
    "weighted": weighted_inputs,
    "sequence": sequence_inputs,
}


def expected_scores(
    ex: Example, records: list[dict[str, Any]], client: redis.Redis, model: nn.Module
) -> dict[str, dict[int, float]]:
    """Per event id, every candidate's score from the module's own forward."""
    out: dict[str, dict[int, float]] = {}
    for record in records:
        dense, sparse = _INPUTS[ex.name](ex, record, client)
        with torch.no_grad():
            raw = model(dense, sparse)
        if ex.name == "deepfm":  # probabilities, one column
            scores = raw.reshape(-1)
        elif ex.name == "dcn":  # logits of two tasks, ranked by 0.7 click + 0.3 purchase
            scores = torch.sigmoid(raw) @ torch.tensor([0.7, 0.3])
        else:  # logits, one column
            scores = torch.sigmoid(raw).reshape(-1)
        candidates = next(record[k] for k in _CANDIDATES if k in record)
        out[event_id(record)] = dict(zip(candidates, scores.double().tolist(), strict=True))
    return out


_CANDIDATES = ("offer_ids", "listing_ids", "article_ids", "video_ids")


def run_pipeline(
    cli: Callable[..., subprocess.Popen],
    settings: Settings,
    ex: Example,
    nproc: int,
    log: Path,
    workers: int = 0,
) -> None:
    """``streamrank run --nproc N`` of the example over what was sent, until idle (with
    ``workers`` ingest workers per rank)."""
    proc = cli(
        settings,
        "run", "--nproc", str(nproc), "--exit-when-idle", "4", "-c", str(ex.toml),
        extra_env={
            "STREAMRANK_BATCHING__MAX_BATCH_ROWS": "128",
            "STREAMRANK_BATCHING__INGEST_WORKERS": str(workers),
        },
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert proc.wait(400) == 0, failure_excerpt(log, 4000)
    if workers:  # the workers did the consuming
        assert "[w0]" in log.read_text(), failure_excerpt(log, 4000)


def run_example(
    cli: Callable[..., subprocess.Popen],
    settings: Settings,
    ex: Example,
    records: list[dict[str, Any]],
    nproc: int,
    log: Path,
    workers: int = 0,
) -> list[dict[str, Any]]:
    """:func:`run_pipeline`, and the Recommendations it wrote: one per event of ``records``,
    none repeated."""
    run_pipeline(cli, settings, ex, nproc, log, workers)
    recs = collect(settings, expected=len(records))
    counts = Counter(r["event_id"] for r in recs)
    assert set(counts) == {event_id(r) for r in records}
    assert max(counts.values()) == 1
    return recs


def assert_scores(
    recs: list[dict[str, Any]],
    records: list[dict[str, Any]],
    expected: dict[str, dict[int, float]],
) -> None:
    """Every published score within 1e-5 of ``expected``, as many items as asked, and none
    left out that scores above the last one published."""
    by_id = {event_id(r): r for r in records}
    worst = 0.0
    for rec in recs:
        want = expected[rec["event_id"]]
        record = by_id[rec["event_id"]]
        asked = record.get("slots") or record.get("want") or record.get("rows") or 5
        assert len(rec["items"]) == min(asked, len(want))
        for item in rec["items"]:
            worst = max(worst, abs(item["score"] - want[item["item_id"]]))
        kth = sorted(want.values(), reverse=True)[len(rec["items"]) - 1]
        assert min(i["score"] for i in rec["items"]) >= kth - 1e-5
    assert worst <= 1e-5


class Stream:
    """Produces ``n`` example events at ``rate`` per second on a thread."""

    def __init__(self, settings: Settings, ex: Example, n: int, rate: float) -> None:
        self.settings, self.ex, self.n, self.rate = settings, ex, n, rate
        self.records: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Stream:
        self._thread.start()
        return self

    def join(self, timeout_s: float = 120) -> list[dict[str, Any]]:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the producer did not finish"
        if self.error is not None:
            raise self.error
        return self.records

    def _run(self) -> None:
        try:
            producer = make_producer(self.settings.kafka.config)
            started = time.monotonic()
            for i, record in enumerate(self.ex.script.events(self.n, seed_=7)):
                time.sleep(max(0.0, started + i / self.rate - time.monotonic()))
                produce(producer, self.settings.topics.input, self.ex.script.encode(record))
                self.records.append(record)
                producer.poll(0)
            assert producer.flush(30) == 0
        except BaseException as exc:
            self.error = exc
