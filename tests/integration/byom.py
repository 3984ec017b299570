"""The worked examples (examples/deepfm, examples/dcn) set up for a test, and their scores
computed the way a user would check them: from the raw events and the raw Redis values, with
the test's own KeyedJaggedTensor and the module's own forward (no streamrank feature code:
transforms, the string hash and the salted row hash are written out here)."""

from __future__ import annotations

import hashlib
import importlib.util
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import redis
import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tests.conftest import REPO_ROOT

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


def make_example(name: str, tmp: Path, prefix: str, checkpoint: Path, steps: int = 5) -> Example:
    """Initialise the example's model and write the test's copy of its TOML."""
    script = load_example(name)
    state_dict = tmp / f"{name}.pt"
    script.init(state_dict, steps=steps)
    user_key, item_key = f"{prefix}:u:{{id}}", f"{prefix}:i:{{id}}"
    text = (EXAMPLES / name / "streamrank.toml").read_text()
    text = text.replace(f'"{script.USER_KEY}"', f'"{user_key}"')
    text = text.replace(f'"{script.ITEM_KEY}"', f'"{item_key}"')
    text = text.replace('schema_file = "examples/', f'schema_file = "{EXAMPLES}/')
    text = text.replace(f'checkpoint = "artifacts/examples/{name}"', f'checkpoint = "{checkpoint}"')
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


def _kjt(keys: list[str], bags: list[list[list[int]]]) -> KeyedJaggedTensor:
    """``bags[key][row]``: the ids of one row's bag."""
    lengths = [len(bag) for per_key in bags for bag in per_key]
    values = [v for per_key in bags for bag in per_key for v in bag]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64),
    )


def _hash_record(client: redis.Redis, key: str) -> dict[bytes, bytes]:
    return client.hgetall(key)  # type: ignore[return-value]


def deepfm_inputs(
    ex: Example, record: dict[str, Any], client: redis.Redis
) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """One PageView's rows, as examples/deepfm/streamrank.toml maps them."""
    viewer = record["viewer"]["id"]
    offers = record["offer_ids"]
    user = _hash_record(client, ex.user_key.replace("{id}", str(viewer)))
    taste = np.frombuffer(user[b"taste"], "<f4") if user else np.zeros(4, np.float32)
    segment = int(user[b"segment"]) if user else 0
    segment = segment if 0 <= segment < 12 else 0
    bags: list[list[list[int]]] = [[], [], [], [], []]
    dense = []
    for offer in offers:
        item = _hash_record(client, ex.item_key.replace("{id}", str(offer)))
        stats = np.frombuffer(item[b"stats"], "<f4") if item else np.zeros(2, np.float32)
        bags[0].append([viewer % 1000])
        bags[1].append([hashed_row(string_id(record["viewer"]["browser"]), 64)])
        bags[2].append([offer % 2000])
        bags[3].append([r % 2000 for r in record["recent_offer_ids"][:5]])
        bags[4].append([segment])
        dense.append([float(record["hour_of_day"]), *taste.tolist(), *stats.tolist()])
    keys = ["viewer", "browser", "offer", "recent_offers", "segment"]
    return torch.tensor(dense, dtype=torch.float32), _kjt(keys, bags)


def dcn_inputs(
    ex: Example, record: dict[str, Any], client: redis.Redis
) -> tuple[torch.Tensor, KeyedJaggedTensor]:
    """One SearchRequest's rows, as examples/dcn/streamrank.toml maps them."""
    session = record["session"]
    raw_user = client.get(ex.user_key.replace("{id}", str(session["shopper_id"])))
    if raw_user is not None:
        profile = np.frombuffer(raw_user[:12], "<f4")  # type: ignore[index]
        recent = np.frombuffer(raw_user[12:], "<i8")[:6].tolist()  # type: ignore[index]
    else:
        profile, recent = np.zeros(3, np.float32), []
    price = record["price_ceiling"]
    bags: list[list[list[int]]] = [[] for _ in range(7)]
    dense = []
    for listing in record["listing_ids"]:
        raw_item = client.get(ex.item_key.replace("{id}", str(listing)))
        if raw_item is not None:
            category = int(np.frombuffer(raw_item[:8], "<i8")[0])  # type: ignore[index]
            quality = np.frombuffer(raw_item[8:], "<f4")  # type: ignore[index]
        else:
            category, quality = 0, np.zeros(4, np.float32)
        bags[0].append([hashed_row(session["shopper_id"], 4096)])
        bags[1].append([hashed_row(string_id(session["country"]), 128)])
        bags[2].append([string_id(session["device"]) % 3])
        bags[3].append([listing])
        bags[4].append([hashed_row(string_id(t), 512) for t in record["query_terms"][:4]])
        bags[5].append([category % 40])
        bags[6].append([r if 0 <= r < 3000 else 0 for r in recent])
        dense.append([0.0 if price is None else price, *profile.tolist(), *quality.tolist()])
    keys = ["shopper", "country", "device", "listing", "terms", "category", "recent"]
    return torch.tensor(dense, dtype=torch.float32), _kjt(keys, bags)


def expected_scores(
    ex: Example, records: list[dict[str, Any]], client: redis.Redis, model: nn.Module
) -> dict[str, dict[int, float]]:
    """Per event id, every candidate's score from the module's own forward."""
    out: dict[str, dict[int, float]] = {}
    for record in records:
        build = deepfm_inputs if ex.name == "deepfm" else dcn_inputs
        dense, sparse = build(ex, record, client)
        with torch.no_grad():
            raw = model(dense, sparse)
        if ex.name == "deepfm":  # probabilities, one column
            scores = raw.reshape(-1)
        else:  # logits of two tasks, ranked by 0.7 click + 0.3 purchase
            scores = torch.sigmoid(raw) @ torch.tensor([0.7, 0.3])
        event_id = record.get("view_id") or record["request_id"]
        candidates = record.get("offer_ids") or record["listing_ids"]
        out[event_id] = dict(zip(candidates, scores.double().tolist(), strict=True))
    return out
