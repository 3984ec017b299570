"""Every command of docs/commands.md's table, run as a user runs it against the real stack; and
every ``streamrank`` command shown in README.md, docs/, BENCHMARKS.md and RELIABILITY.md parsed.

Small sizes throughout (a tiny model, tens of events, fractions of a second of timing): each
command must finish and print what the docs say it prints, so none can silently break again.
The table itself is checked against the CLI (every command and option shown exists) and against
this file (every command has a smoke test here). A command shown elsewhere is parsed by the
CLI's own parser without running (a synopsis such as ``[--events N]``: its command and option
names), so every one of them runs as written.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
import typer.testing

from model.store.checkpoint import load_meta
from pipeline.cli import app
from pipeline.connectors.avro.reference import RECOMMENDATION_SCHEMA_FILE, RecordCodec
from pipeline.connectors.kafka.clients import ensure_topics, make_producer, produce
from pipeline.tools.bench.common import delete_topics
from pipeline.tools.bench.swap import NEW, OLD
from pipeline.tools.synthetic_io import produce_events
from pipeline.tools.synthetic_settings import synthetic_settings
from tests.conftest import LocalStack
from tests.pipeline.cli.documented_commands import (
    DocumentedCommand,
    check_options,
    cli_commands,
    documented_commands,
    is_mention,
    parse,
)
from tests.pipeline.cli.readme_workspace import (
    Workspace,
    bench_topics,
    build_workspace,
    command_table,
    messages_in,
    running_prometheus,
    strict_json,
)
from tests.pipeline.tools.test_capacity import H200, OVERHEAD

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) \S+: ")

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def workspace(local_stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return build_workspace(local_stack, tmp_path_factory.mktemp("readme"))


SMOKE: dict[str, Callable[[Workspace], None]] = {}


def smoke(name: str) -> Callable[[Callable[[Workspace], None]], Callable[[Workspace], None]]:
    def register(check: Callable[[Workspace], None]) -> Callable[[Workspace], None]:
        SMOKE[name] = check
        return check

    return register


@smoke("run")
def check_run(ws: Workspace) -> None:
    settings, env = ws.fresh("run")
    ensure_topics(settings.kafka.config, settings.topics)
    produce_events(settings, ws.world, 40, malformed=3)
    log, summary_file = ws.directory / "run.log", ws.directory / "run-summary.json"
    ws.cli(
        "run",
        "--exit-when-idle",
        "2",
        "--summary-json",
        str(summary_file),
        env=env,
        log_file=log,
    )
    lines = log.read_text().splitlines()
    # `tail -n 1` of the log is the summary, strict JSON; every line before is one record.
    summary = strict_json(lines[-1])
    assert summary["events_out"] == 40 and summary["dead_lettered"] == 3, summary
    assert isinstance(summary["latency_p99_ms"], float)
    assert strict_json(summary_file.read_text()) == summary
    assert all(LOG_LINE.match(line) for line in lines[:-1]), lines[:-1]
    assert "is_fx_tracing" not in log.read_text()

    # With no input at all, and JSON logs: every line an object, null latencies (not NaN).
    _, idle_env = ws.fresh("run-idle")
    json_log = ws.directory / "run-json.log"
    ws.cli("--log-format", "json", "run", "--exit-when-idle", "1", env=idle_env, log_file=json_log)
    records = [strict_json(line) for line in json_log.read_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records[:-1])
    assert records[-1]["events_out"] == 0 and records[-1]["latency_p50_ms"] is None


@smoke("plan")
def check_plan(ws: Workspace) -> None:
    # --json is tested in test_plan.py; here the table, for GPUs (planning runs nothing).
    text = ws.cli("plan", "--nproc", "2", "--device", "cuda").stdout
    assert "sharding plan for 2 rank(s)" in text
    assert "rank 0:" in text and "rank 1:" in text


@smoke("produce")
def check_produce(ws: Workspace) -> None:
    settings, env = ws.fresh("produce")
    result = ws.cli("produce", "--events", "20", "--malformed", "2", "--seed", "3", env=env)
    assert f"produced 20 events and 2 malformed messages to {settings.topics.input}" in (
        result.stderr
    )
    assert messages_in(settings, settings.topics.input) == 22


@smoke("consume")
def check_consume(ws: Workspace) -> None:
    settings, env = ws.fresh("consume")
    ensure_topics(settings.kafka.config, settings.topics)
    codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, settings.topics.output)
    producer = make_producer(settings.kafka.config)
    for n in range(3):
        record = {
            "event_id": f"event-{n}",
            "user_id": n,
            "items": [{"item_id": 7, "score": 0.5}],
            "model_version": "m-1",
            "scored_at": int(time.time() * 1000),
            "fallback_features": [],
        }
        produce(producer, settings.topics.output, codec.encode(record))
    assert producer.flush(30) == 0
    out = ws.cli("consume", "--max", "3", "--timeout", "20", env=env).stdout.splitlines()
    assert sorted(strict_json(line)["event_id"] for line in out) == [
        "event-0",
        "event-1",
        "event-2",
    ]


@smoke("seed-features")
def check_seed_features(ws: Workspace) -> None:
    world = synthetic_settings(ws.settings)
    result = ws.cli("seed-features")
    assert f"seeded {world.num_users} users and {world.num_items} items from synthetic world" in (
        result.stderr
    )
    dense = ",".join(f"dense_{k}" for k in range(ws.settings.model.user_dense_dim))
    values = ",".join("0.5" for _ in range(ws.settings.model.user_dense_dim))
    item_dense = ",".join(f"dense_{k}" for k in range(ws.settings.model.item_dense_dim))
    item_values = ",".join("0.25" for _ in range(ws.settings.model.item_dense_dim))
    users, items = ws.directory / "users.csv", ws.directory / "items.csv"
    users.write_text(f"user_id,{dense},recent\n9000001,{values},5 6\n9000002,{values},\n")
    items.write_text(f"item_id,category,{item_dense}\n9000003,4,{item_values}\n")
    result = ws.cli("seed-features", "--users", str(users), "--items", str(items))
    assert "seeded 2 users and 1 items from files" in result.stderr
    client = redis.Redis.from_url(ws.settings.redis.url)
    prefix = ws.settings.redis.key_prefix
    assert client.exists(f"{prefix}:u:9000001", f"{prefix}:i:9000003") == 2
    client.close()


@smoke("init-model")
def check_init_model(ws: Workspace) -> None:
    out = ws.directory / "new-model"
    result = ws.cli(
        "init-model", "--events", "300", "--epochs", "1", "--seed", "1", "--out", str(out)
    )
    meta = load_meta(out)
    assert f"saved {meta.model_version} to {out}" in result.stderr
    assert "held-out AUC" in result.stderr


@smoke("bench model")
def check_bench_model(ws: Workspace) -> None:
    result = ws.cli("bench", "model", "--batch-rows", "64", "--seconds", "0.2", "--json")
    report = strict_json(result.stdout.splitlines()[-1])
    assert report["model_version"] == load_meta(ws.settings.model.checkpoint).model_version
    assert report["rows_per_s"] > 0


@smoke("bench pipeline")
def check_bench_pipeline(ws: Workspace) -> None:
    before = bench_topics(ws.settings)
    result = ws.cli(
        "bench",
        "pipeline",
        "--events",
        "30",
        "--per-event-events",
        "5",
        "--rounds",
        "1",
        "--model-seconds",
        "0.2",
        "--json",
    )
    report = strict_json(result.stdout.splitlines()[-1])
    assert report["rounds"] == 1 and len(report["e2e_over_bare"]) == 1
    assert report["e2e_rows_per_s"] > 0 and report["per_event_rows_per_s"] > 0
    deleted = re.search(r"deleted the benchmark's topics: (.+)$", result.stderr, re.MULTILINE)
    assert deleted is not None and len(deleted.group(1).split(", ")) == 6  # 2 runs x 3 topics
    deadline = time.monotonic() + 60  # until the deletion reaches the broker's metadata
    while bench_topics(ws.settings) - before:
        assert time.monotonic() < deadline, bench_topics(ws.settings) - before
        time.sleep(0.2)


def _bench_ranks(ws: Workspace, nproc: str) -> Any:
    result = ws.cli(
        "bench",
        "ranks",
        "--events",
        "20",
        "--rounds",
        "1",
        "--nproc",
        nproc,
        "--keep-topics",
        "--json",
    )
    kept = re.search(r"keeping the benchmark's topics: (.+)$", result.stderr, re.MULTILINE)
    assert kept is not None
    names = kept.group(1).split(", ")
    assert len(names) == 3 * len(nproc.split(",")) and set(names) <= bench_topics(ws.settings)
    assert delete_topics(ws.settings, names) == names
    return strict_json(result.stdout.splitlines()[-1])


@smoke("bench ranks")
def check_bench_ranks(ws: Workspace) -> None:
    report = _bench_ranks(ws, "1,2")  # one process, then torchrun with 2 ranks
    assert report["rows_per_s"]["1"][0] > 0 and report["rows_per_s"]["2"][0] > 0
    assert len(report["rank_steps"]["2"][0]) == 2  # both ranks reported


@smoke("bench quantize")
def check_bench_quantize(ws: Workspace) -> None:
    result = ws.cli("bench", "quantize", "--batch-rows", "64", "--seconds", "0.1", "--json")
    report = strict_json(result.stdout.splitlines()[-1])
    dtypes = [q["dtype"] for q in report["quantization"]]
    assert dtypes == ["fp16", "int8"]


@smoke("bench compile")
def check_bench_compile(ws: Workspace) -> None:
    result = ws.cli(
        "bench", "compile", "--batch-rows", "64", "--seconds", "0.1", "--rounds", "1", "--json"
    )
    report = strict_json(result.stdout.splitlines()[-1])
    assert len(report["compiled_rows_per_s"]) == 1
    assert report["max_abs_score_diff"] < 1e-4


@smoke("bench overhead")
def check_bench_overhead(ws: Workspace) -> None:
    result = ws.cli("bench", "overhead", "--events", "50", "--json")
    report = strict_json(result.stdout.splitlines()[-1])
    assert report["events"] == 50 and report["passthrough_eps"] > 0
    assert {"decode", "forward", "produce"} <= report["stages_us"].keys()


@smoke("bench ingest")
def check_bench_ingest(ws: Workspace) -> None:
    args = ["--workers", "0,1", "--events", "60", "--rounds", "1", "--json"]
    report = strict_json(ws.cli("bench", "ingest", *args).stdout.splitlines()[-1])
    assert set(report["events_per_s"]) == {"0", "1"}
    assert report["median"]["1"]["workers_cpu_us_per_event"] > 0
    assert report["median"]["0"]["workers_cpu_us_per_event"] == 0  # no workers: all in one
    assert report["transport"]["us_per_batch"] > 0 and report["transport"]["pickled_us"] > 0


@smoke("bench codec")
def check_bench_codec(ws: Workspace) -> None:
    # Without --json: one "dotted.key: JSON value" line per figure on stdout.
    result = ws.cli("bench", "codec", "--events", "70", "--rounds", "1")
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert json.loads(lines["events"]) == 70
    assert len(json.loads(lines["us_per_event.decode_columnar"])) == 1
    assert json.loads(lines["decode_speedup"]) > 0


@smoke("bench precision")
def check_bench_precision(ws: Workspace) -> None:
    result = ws.cli(
        "bench", "precision", "--batch-rows", "64", "--seconds", "0.1", "--rounds", "1", "--json"
    )
    report = strict_json(result.stdout.splitlines()[-1])
    assert set(report["variants"]) == {"fp32", "tf32", "bf16"}


@smoke("report")
def check_report(ws: Workspace) -> None:
    out = ws.directory / "report"
    with running_prometheus(ws.directory) as url:
        result = ws.cli(
            "report",
            "--out",
            str(out),
            "--prometheus",
            url,
            "--since",
            "1m",
            "--rate-window",
            "30s",
        )
    names = ["throughput.png", "latency.png", "dlq.png", "batch_rows.png"]
    assert all((out / name).read_bytes().startswith(PNG_MAGIC) for name in names)
    assert result.stderr.count("wrote ") == 4


@smoke("model list")
def check_model_list(ws: Workspace) -> None:
    versions = _versions_dir(ws)
    listed = json.loads(ws.cli("model", "list", "--dir", str(versions), "--json").stdout)
    assert listed["current"] == "v1"
    assert [v["version"] for v in listed["versions"]] == ["v1"]


@smoke("model import")
def check_model_import(ws: Workspace) -> None:
    versions = _versions_dir(ws)
    ckpt = str(ws.settings.model.checkpoint)
    ws.cli("model", "import", ckpt, "--dir", str(versions), "--version", "v2")
    listed = json.loads(ws.cli("model", "list", "--dir", str(versions), "--json").stdout)
    assert {v["version"] for v in listed["versions"]} == {"v1", "v2"}
    assert listed["current"] == "v1"  # imported, not promoted


@smoke("model promote")
def check_model_promote(ws: Workspace) -> None:
    versions = _versions_dir(ws)
    ckpt = str(ws.settings.model.checkpoint)
    ws.cli("model", "import", ckpt, "--dir", str(versions), "--version", "v3")
    result = ws.cli("model", "promote", "v3", "--dir", str(versions))
    assert "v3 is current" in result.stderr
    listed = json.loads(ws.cli("model", "list", "--dir", str(versions), "--json").stdout)
    assert listed["current"] == "v3" and listed["previous"] == "v1"


def _versions_dir(ws: Workspace) -> Path:
    """A fresh versions directory holding the workspace's model as version ``v1`` (current)."""
    versions = ws.directory / f"versions-{uuid.uuid4().hex[:6]}"
    ckpt = str(ws.settings.model.checkpoint)
    ws.cli("model", "import", ckpt, "--dir", str(versions), "--version", "v1", "--promote")
    return versions


@smoke("bench soak")
def check_bench_soak(ws: Workspace) -> None:
    out = ws.directory / "soak"
    args = ["--minutes", "0.2", "--sample-s", "2", "--warmup-s", "4", "--capacity-events", "300"]
    # 8 s of samples cannot project a day's growth: the slope check is tested in test_soak.py
    args += ["--max-growth-24h", "1000"]
    result = ws.cli("bench", "soak", *args, "--out", str(out), "--json")
    report = strict_json(result.stdout.splitlines()[-1])
    assert report["passed"] and report["checks"]["nothing_lost"]
    assert report["rss"]["mib_per_hour"] is not None and report["rss"]["shape"] is not None
    assert strict_json((out / "soak.json").read_text()) == report
    assert (out / "soak.png").read_bytes().startswith(PNG_MAGIC)
    assert (out / "pipeline.log").stat().st_size > 0 and (out / "producer.log").exists()
    # Half of the measured capacity, for the 12 s of the run; nothing lost, all committed.
    capacity = report["capacity_events_per_s"]
    assert capacity > 0 and report["rate"] == pytest.approx(0.5 * capacity, rel=1e-3)
    assert abs(report["events"] - report["rate"] * 12) <= 1
    assert report["events_on_input"] == report["events"] and report["missing"] == 0
    assert report["pipeline_summary"]["events_out"] >= report["events"]
    assert report["lag_after_stop"] == 0
    assert report["pipeline_exit"] == 0 and report["producer_exit"] == 0
    samples = report["samples"]
    assert {s["phase"] for s in samples} >= {"load"} and len(samples) >= 3
    assert all(s["rss_bytes"] > 0 and s["lag"] >= 0 for s in samples)
    loaded = [s for s in samples if s["phase"] == "load" and s["t_s"] >= 4]
    assert report["rss_base_bytes"] == loaded[0]["rss_bytes"]
    assert report["rss_end_bytes"] == loaded[-1]["rss_bytes"]


@smoke("bench retrieval")
def check_bench_retrieval(ws: Workspace) -> None:
    args = ["--items", "2000", "--queries", "50", "--k", "20", "--nprobe", "8", "--json"]
    report = strict_json(ws.cli("bench", "retrieval", *args).stdout.splitlines()[-1])
    (row,) = report["ivfpq"]["by_nprobe"]
    assert 0.0 <= row["recall_at_k"] <= 1.0 and report["exact"]["ms_per_event"] > 0


@smoke("bench swap")
def check_bench_swap(ws: Workspace) -> None:
    args = ["--rate", "40", "--seconds", "6", "--swap-at", "2", "--window-s", "1", "--json"]
    report = strict_json(ws.cli("bench", "swap", *args).stdout.splitlines()[-1])
    assert report["events"] == 240 and report["missing"] == report["duplicates"] == 0
    assert report["switched_once"] and report["versions"] == [OLD, NEW]
    assert sum(w["events"] for w in report["windows"].values()) == 240
    assert report["windows"]["before"]["events"] > 0, report
    assert report["windows"]["swap"]["events"] > 0, report
    assert report["first_new_ms"] > 0 and len(report["loop_pause_s"]) == 1
    assert report["pipeline_exit"] == 0


@smoke("plan-capacity")
def check_plan_capacity(ws: Workspace) -> None:
    reports = {"overhead.json": OVERHEAD, "model.json": H200}
    args = []
    for name, report in reports.items():
        (ws.directory / name).write_text(json.dumps(report) + "\n")
        args += ["--from", str(ws.directory / name)]
    text = ws.cli("plan-capacity", *args).stdout
    assert "gpus = ceil(rows_per_s / (gpu_rows_per_s x u)) = 8" in text


@smoke("bench latency")
def check_bench_latency(ws: Workspace) -> None:
    args = ["--capacity-only", "--capacity-events", "100", "--json"]
    report = strict_json(ws.cli("bench", "latency", *args).stdout.splitlines()[-1])
    assert report["capacity_events_per_s"] > 0 and report["loads"] == []


def test_the_table_lists_every_command_and_each_has_a_smoke_test() -> None:
    table, cli = command_table(), cli_commands()
    assert set(table) == set(cli), "docs/commands.md's table and the CLI disagree"
    assert set(SMOKE) == set(cli), "a command without a smoke test here"
    for name, options in table.items():
        known = {opt for param in cli[name].params for opt in param.opts}
        assert options <= known, f"docs/commands.md shows {options - known} for `{name}`"


DOCUMENTED = documented_commands()


def test_the_documents_show_commands() -> None:
    where = {c.where.split(":")[0] for c in DOCUMENTED}
    assert {"README.md", "docs/commands.md", "BENCHMARKS.md"} <= where, where
    assert any(c.words[:2] == ("bench", "latency") for c in DOCUMENTED)


@pytest.mark.parametrize("command", DOCUMENTED, ids=str)
def test_every_documented_command_runs_as_written(command: DocumentedCommand) -> None:
    if is_mention(command):
        check_options(command)
    else:
        parse(command)


@pytest.mark.parametrize("name", sorted(cli_commands()))
def test_help_of_every_command(name: str) -> None:
    result = typer.testing.CliRunner().invoke(app, [*name.split(), "--help"])
    assert result.exit_code == 0, result.output
    assert "--config" in result.output


_SLOW = {
    "bench compile": "torch.compile (inductor) takes a minute on a busy 2-core machine",
    "bench soak": "a capacity run, then the pipeline and a producer for 12 s",
    "bench ingest": "two runs, one of them spawning a worker (a fresh interpreter with torch)",
    "bench swap": "trains nothing, but runs the pipeline as a child through a model swap",
    "bench ranks": "a one-process run, then torchrun with two ranks",
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[pytest.mark.slow] if name in _SLOW else [])
        for name in sorted(SMOKE)
    ],
)
def test_documented_command(name: str, workspace: Workspace) -> None:
    SMOKE[name](workspace)
