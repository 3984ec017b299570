"""The user's output contract on the real broker and Redis: the DCN example (two task columns)
served by ``streamrank run`` (one and two ranks) with the output schema of its own
(examples/dcn/listing_ranking.avsc, the ``[output]`` section its streamrank.toml documents). A
consumer built only from that ``.avsc`` (confluent-kafka and fastavro, not streamrank's reader)
reads every scored event: each task score under its name equal to the module's own forward for
that row, the ranked listings and scores as ``score_weights`` rank them, the search's fields
echoed as sent."""

from __future__ import annotations

import io
import json
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
import pytest
import redis
import torch
from confluent_kafka import Consumer

from model.module.store import import_state_dict
from model.store.versions import ModelVersions
from pipeline.models.preflight import configured_module
from pipeline.settings.loading import Settings
from tests.faults.helpers import dead_letters
from tests.integration.byom import (
    EXAMPLES,
    Example,
    dcn_inputs,
    documented_output,
    example_settings,
    make_example,
    run_pipeline,
    send,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EVENTS = 120
WEIGHTS = (0.7, 0.3)  # examples/dcn/streamrank.toml's score_weights (click, purchase)


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + " }"
    return json.dumps(value)


@pytest.fixture
def dcn_with_output(
    tmp_path: Path,
    settings_factory: Callable[..., Settings],
    redis_client: redis.Redis,
    unique_name: Callable[[str], str],
) -> tuple[Example, Settings]:
    """The DCN example with its documented [output] section, its model imported and promoted,
    its features seeded."""
    versions = tmp_path / "versions"
    ex = make_example("dcn", tmp_path, unique_name("out"), versions)
    section = documented_output()
    with ex.toml.open("a") as f:
        f.write("\n[output]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in section.items()))
    settings = example_settings(ex, settings_factory())
    assert settings.output.configured and settings.output.task_scores
    ex.script.seed(redis_client, ex.user_key, ex.item_key)
    config, _ = configured_module(settings)
    assert config.output.task_columns == (0, 1)
    prefix = settings.model.module.state_dict_prefix if settings.model.module else ""
    import_state_dict(
        config, ex.state_dict, ModelVersions.create(versions), strip_prefix=prefix, promote=True
    )
    return ex, settings


def _read_all(consumer: Consumer, schema: Any, expected: int) -> list[dict[str, Any]]:
    """Every record on the output topic, decoded with the schema alone; a few seconds past the
    expected count, so that a record written twice would be seen."""
    messages = dead_letters(consumer, expected, timeout_s=120)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        messages += [m for m in consumer.consume(100, 0.5) if m.error() is None]
    out = []
    for message in messages:
        value = message.value() or b""
        buf = io.BytesIO(value)
        out.append(fastavro.schemaless_reader(buf, schema, None))
        assert buf.tell() == len(value), "bytes left over: not a record of the schema"
    return out


def _task_probabilities(
    ex: Example, records: list[dict[str, Any]], client: redis.Redis
) -> dict[str, dict[int, tuple[float, float]]]:
    """Per search, every listing's (click, purchase) probabilities: the module's own forward
    (the trainer's DLRM_DCN with the saved weights) on inputs built from the raw event and
    Redis values, then the sigmoid of its two logits."""
    model = ex.reference()
    out = {}
    for record in records:
        dense, sparse = dcn_inputs(ex, record, client)
        with torch.no_grad():
            probs = torch.sigmoid(model(dense, sparse)).double()
        out[record["request_id"]] = {
            listing: (float(p[0]), float(p[1]))
            for listing, p in zip(record["listing_ids"], probs, strict=True)
        }
    return out


@pytest.mark.parametrize(("nproc", "workers"), [(1, 0), (2, 0), (1, 2)], ids=["1", "2", "1-w2"])
def test_a_consumer_of_the_users_schema_reads_every_event_with_each_task_score_by_name(
    nproc: int,
    workers: int,
    dcn_with_output: tuple[Example, Settings],
    redis_client: redis.Redis,
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
    consumer_factory: Callable[..., Consumer],
) -> None:
    ex, settings = dcn_with_output
    records = ex.script.events(EVENTS, seed_=10 + nproc)
    send(settings, ex, records)
    started_ms = int(time.time() * 1000)
    run_pipeline(cli, settings, ex, nproc, tmp_path / "run.log", workers)  # task columns: slots

    schema_file = EXAMPLES / "dcn" / "listing_ranking.avsc"
    schema = fastavro.parse_schema(json.loads(schema_file.read_text()))  # the .avsc alone
    got = _read_all(consumer_factory(settings.topics.output), schema, EVENTS)
    counts = Counter(r["request_id"] for r in got)
    assert set(counts) == {r["request_id"] for r in records}, "an event was lost"
    assert max(counts.values()) == 1, "an event was answered twice"

    version = ModelVersions(settings.model.checkpoint).current()
    probabilities = _task_probabilities(ex, records, redis_client)
    by_id = {r["request_id"]: r for r in records}
    worst = 0.0
    for out in got:
        record = by_id[out["request_id"]]
        session = record["session"]
        assert out["shopper_id"] == session["shopper_id"]
        assert (out["country"], out["device"]) == (session["country"], session["device"])
        assert out["price_ceiling"] == record["price_ceiling"]  # null stays null
        assert out["model"] == version and out["sent_at_ms"] == record["sent_at_ms"]
        assert started_ms - 60_000 <= out["ranked_at"].timestamp() * 1000 <= time.time() * 1000
        assert out["channel"] == "search"  # not mapped: the schema's default
        want = probabilities[out["request_id"]]
        ranked = out["ranked"]
        assert len(ranked) == min(record["want"], len(want))
        for entry in ranked:
            click, purchase = want[entry["listing_id"]]
            worst = max(
                worst,
                abs(entry["p_click"] - click),
                abs(entry["p_purchase"] - purchase),
                abs(entry["score"] - (WEIGHTS[0] * click + WEIGHTS[1] * purchase)),
            )
        scores = [entry["score"] for entry in ranked]
        assert scores == sorted(scores, reverse=True), "not best first"
        weighted = sorted((WEIGHTS[0] * c + WEIGHTS[1] * p for c, p in want.values()), reverse=True)
        assert min(scores) >= weighted[len(ranked) - 1] - 1e-5, "a better listing was left out"
    assert worst <= 1e-5
    degraded = [out for out in got if "user_features" in out["degraded"]]
    assert degraded and len(degraded) < len(got)  # shoppers without a Redis record, flagged
    if nproc == 1 and not workers:  # `streamrank consume` prints the user's records as JSON lines
        consume = cli(
            settings, "consume", "--max", "3", "--timeout", "20", "-c", str(ex.toml),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        stdout, stderr = consume.communicate(timeout=120)
        assert consume.returncode == 0, stderr[-2000:]
        printed = [json.loads(line) for line in stdout.splitlines()]
        assert len(printed) == 3 and {p["request_id"] for p in printed} <= set(counts)
        assert all(isinstance(p["ranked_at"], int) and "p_click" in p["ranked"][0] for p in printed)
