"""Retrieval with a configured model: the worked examples, configured for retrieval, served by
``streamrank run`` on the real broker and Redis, one and two ranks (and one rank with an ingest
worker), with events that bring no candidates. The test computes each such event's best items
itself, from the raw vectors (the module's weights, or the vectors it seeded in Redis), and
checks that every published item is one of them, that the ranking is right, and every score
within 1e-5 of the module's own forward on the test's own KJT (tests/integration/byom.py: no
streamrank feature code)."""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
from confluent_kafka import Consumer
from torch import nn

from pipeline.settings.loading import Settings
from pipeline.stages.dead_letter import DETAIL_HEADER, REASON_HEADER
from tests.faults.helpers import dead_letters
from tests.integration.byom import (
    Example,
    event_id,
    expected_scores,
    hashed_row,
    prepare_example,
    run_example,
    send,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EVENTS = 120
CANDIDATES = 8  # retrieval.num_candidates
_DEEPFM_OFF = "enabled = false                               # every page view brings its offers"
_DCN_OFF = "[retrieval]\nenabled = false\n"
#: ingest workers retrieve from the version they start with: no live swap (Settings refuses it)
_NO_SWAP = ("[topics]\n", "[model_swap]\nenabled = false\n\n[topics]\n")

#: variant -> (example, edits of its streamrank.toml)
VARIANTS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "tables": (
        "deepfm",
        (
            (
                _DEEPFM_OFF,
                f"num_candidates = {CANDIDATES}\n"
                'query = { source = "table", table = "t_viewer" }\n'
                'items = { source = "table", table = "t_offer" }\n',
            ),
        ),
    ),
    "identity-table": (
        "dcn",
        (
            (
                _DCN_OFF,
                f"[retrieval]\nnum_candidates = {CANDIDATES}\n"
                'query = { source = "table", table = "t_shopper" }\n'
                'items = { source = "table", table = "t_listing" }\n'
                'catalogue = "table"\n',
            ),
        ),
    ),
    "redis-vectors": (
        "deepfm",
        (
            (
                _DEEPFM_OFF,
                f"num_candidates = {CANDIDATES}\n"
                'query = { source = "user", field = "taste" }\n'
                'items = { source = "item", field = "embedding" }\n',
            ),
            ('{ stats = "vector:2" }', '{ stats = "vector:2", embedding = "vector:4" }'),
        ),
    ),
}  # fmt: skip


def _table(model: nn.Module, name: str) -> np.ndarray:
    """The module's table ``name``, as its trainer saved it."""
    state = model.state_dict()
    key = next(k for k in state if k.endswith(f"embedding_bags.{name}.weight"))
    return state[key].double().numpy()


def _seed_embeddings(ex: Example, client: redis.Redis) -> dict[int, np.ndarray]:
    """An ``embedding`` (float32[4]) beside each offer's stats, but every tenth offer's."""
    rng = np.random.default_rng(5)
    vectors = {}
    pipe = client.pipeline(transaction=False)
    for offer in range(ex.script.OFFERS):
        vector = rng.standard_normal(4).astype("<f4")
        if offer % 10 == 4:
            continue
        vectors[offer] = vector
        pipe.hset(ex.item_key.replace("{id}", str(offer)), "embedding", vector.tobytes())
    pipe.execute()
    return vectors


class _Vectors:
    """What the test knows of a variant: each user's query and the catalogue's vectors, from
    the raw weights or the raw Redis values (``None``: the user has no query vector)."""

    def __init__(self, variant: str, ex: Example, client: redis.Redis, model: nn.Module) -> None:
        self.variant, self.ex, self.client = variant, ex, client
        if variant == "tables":
            self.viewers = _table(model, "t_viewer")
            offers = _table(model, "t_offer")
            self.items = np.arange(ex.script.OFFERS)  # the keys seeded: [features.item].key
            self.vectors = offers[self.items % 2000]
        elif variant == "identity-table":
            self.shoppers = _table(model, "t_shopper")
            self.items = np.arange(3000)  # the rows of t_listing
            self.vectors = _table(model, "t_listing")
        else:
            embeddings = _seed_embeddings(ex, client)
            self.items = np.array(sorted(embeddings))
            self.vectors = np.stack([embeddings[i] for i in self.items.tolist()]).astype(float)

    def query(self, record: dict[str, Any]) -> np.ndarray | None:
        if self.variant == "tables":
            return self.viewers[record["viewer"]["id"] % 1000]
        if self.variant == "identity-table":
            return self.shoppers[hashed_row(record["session"]["shopper_id"], 4096)]
        key = self.ex.user_key.replace("{id}", str(record["viewer"]["id"]))
        raw = self.client.hget(key, "taste")
        return None if raw is None else np.frombuffer(raw, "<f4").astype(float)  # type: ignore[arg-type]

    def best(self, query: np.ndarray) -> tuple[set[int], set[int]]:
        """The items surely among the ``CANDIDATES`` best by inner product, and those tied with
        the last of them within float precision (either may have been retrieved)."""
        products = self.vectors @ query
        last = np.sort(products)[::-1][CANDIDATES - 1]
        eps = 1e-5 * float(np.abs(self.vectors).max() * np.abs(query).sum()) + 1e-9
        sure = set(self.items[products > last + eps].tolist())
        maybe = set(self.items[np.abs(products - last) <= eps].tolist())
        assert len(sure) <= CANDIDATES <= len(sure) + len(maybe)
        return sure, maybe


def _candidates(record: dict[str, Any]) -> str:
    return "offer_ids" if "offer_ids" in record else "listing_ids"


#: (variant, ranks, ingest workers per rank): every variant on one and two ranks, and one
#: behind an ingest worker (its retrieval index, feature map and output contract in the worker)
CASES = [(v, n, 0) for n in (1, 2) for v in VARIANTS] + [("tables", 1, 1)]


@pytest.mark.parametrize(
    ("variant", "nproc", "workers"),
    CASES,
    ids=[f"{v}-{n}" + (f"-w{w}" if w else "") for v, n, w in CASES],
)
def test_events_without_candidates_are_ranked_from_the_configured_index(
    variant: str,
    nproc: int,
    workers: int,
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    redis_client: redis.Redis,
    unique_name: Callable[[str], str],
    cli: Callable[..., subprocess.Popen],
    consumer_factory: Callable[..., Consumer],
) -> None:
    name, edits = VARIANTS[variant]
    if workers:
        edits = (*edits, _NO_SWAP)
    ex, settings = prepare_example(
        name, tmp_path, settings_factory(), redis_client, unique_name("byomr"), edits
    )
    model = ex.reference()
    known = _Vectors(variant, ex, redis_client, model)
    records = ex.script.events(EVENTS, seed_=nproc)
    asking = records[::3]
    for record in asking:
        record[_candidates(record)] = []
    unqueried = [r for r in asking if known.query(r) is None]
    served = [r for r in records if not any(r is u for u in unqueried)]
    assert variant != "redis-vectors" or unqueried  # viewers without a record: no taste
    send(settings, ex, records)
    recs = run_example(cli, settings, ex, served, nproc, tmp_path / "run.log", workers)

    asked = {event_id(r) for r in asking}
    assert {r["event_id"] for r in recs if r["retrieved"]} == asked - {
        event_id(r) for r in unqueried
    }
    by_id = {event_id(r): r for r in served}
    worst = 0.0
    for rec in recs:
        record = by_id[rec["event_id"]]
        sure, maybe = set(record[_candidates(record)]), set()
        if rec["retrieved"]:
            query = known.query(record)
            assert query is not None
            sure, maybe = known.best(query)
            record = copy.deepcopy(record)
            record[_candidates(record)] = sorted(sure | maybe)
        scores = expected_scores(ex, [record], redis_client, model)[rec["event_id"]]
        wanted = record.get("slots") or record.get("want") or 5
        got = {item["item_id"]: item["score"] for item in rec["items"]}
        assert (
            len(got)
            == len(rec["items"])
            == min(wanted, CANDIDATES if rec["retrieved"] else len(sure))
        )
        assert set(got) <= set(scores), "an item that is not among the index's best"
        worst = max([worst, *(abs(score - scores[item]) for item, score in got.items())])
        last = min(got.values())
        assert all(item in got for item in sure if scores[item] > last + 1e-5), "ranking"
    assert worst <= 1e-5

    if unqueried:
        letters = dead_letters(consumer_factory(settings.topics.dlq), len(unqueried))
        assert len(letters) == len(unqueried)
        headers = [dict(m.headers() or []) for m in letters]
        assert {h[REASON_HEADER].decode() for h in headers} == {"no_candidates"}
        assert all(
            "no query vector (features.user.fields.taste)" in h[DETAIL_HEADER].decode()
            for h in headers
        )
