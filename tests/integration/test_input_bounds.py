"""What bounds the input side's memory, on the real broker and Redis: the input topic refuses a
record over ``topics.input_max_message_bytes`` at the producer; values just over
``codec.max_message_bytes`` reach the pipeline and are dead-lettered (never copied into the
decode buffer); a Redis value over ``redis.max_value_bytes`` is served as defaults, flagged;
nothing is lost, and the pipeline's peak memory does not hold a copy of the huge value beyond
the client's read of it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from confluent_kafka import Consumer, KafkaError

from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec
from pipeline.connectors.kafka.clients import ensure_topics, make_producer
from pipeline.connectors.kafka.limits import input_record_limit
from pipeline.connectors.redis.feature_store import user_key
from pipeline.settings.loading import Settings
from pipeline.stages.dead_letter import REASON_HEADER
from pipeline.types import RejectReason
from tests.faults.helpers import dead_letters
from tests.integration.conftest import SentEvents, collect, wait_for_outputs
from tests.support.logs import failure_excerpt

pytestmark = pytest.mark.slow

HUGE_BYTES = 96 * 2**20
"""The huge Redis value: far above any memory the pipeline needs for these events."""
HUGE_USER = 10**9
"""A user of no other event, so no batch serves it from the cache."""


def _memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of ``pid``, in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def _reset_peak(pid: int) -> None:
    """Make ``VmHWM`` start again from the current RSS (Linux ``clear_refs`` 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _over(codec: RecordCodec, template: dict[str, object], size: int, event_id: str) -> bytes:
    """A valid UserEvent of at least ``size`` bytes (a long recent-items list)."""
    value = codec.encode({**template, "event_id": event_id})
    items = 0
    while len(value) < size:
        items += max(1, (size - len(value)) // 6)
        value = codec.encode({**template, "event_id": event_id, "recent_item_ids": [2**40] * items})
    return value


def test_oversized_records_go_to_the_dlq_and_a_huge_redis_value_to_the_defaults(
    pipeline_settings: Settings,
    send_events: Callable[..., SentEvents],
    consumer_factory: Callable[..., Consumer],
    tmp_path: Path,
    cli: Callable[..., subprocess.Popen],
) -> None:
    settings = pipeline_settings
    limit = settings.codec.max_message_bytes
    ensure_topics(settings.kafka.config, settings.topics)  # as `run` creates it
    topic_limit = input_record_limit(settings.kafka.config, settings.topics.input)
    assert topic_limit == settings.topics.input_max_message_bytes

    # A record over the topic's limit is refused by the broker, at the producer.
    refused: list[KafkaError] = []
    big_producer = make_producer(
        settings.kafka.config, extra={"message.max.bytes": 4 * topic_limit}
    )
    big_producer.produce(
        settings.topics.input,
        os.urandom(topic_limit + 1),  # incompressible: the batch stays over the limit
        on_delivery=lambda err, _msg: refused.append(err),
    )
    assert big_producer.flush(30) == 0
    assert [e.code() for e in refused] == [KafkaError.MSG_SIZE_TOO_LARGE]

    log = tmp_path / "run.log"
    # The 96 MiB read must finish, even on a slow machine: this test is about the size bound,
    # not the read timeout (a timed-out read serves defaults too, but says so differently).
    # Stopped by SIGTERM once every output is there, not by an idle timer: the test's own
    # steps (a 96 MiB SET, encoding, producing) may outlast any idle time on a loaded host.
    proc = cli(
        settings,
        "run",
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        extra_env={"STREAMRANK_REDIS__SOCKET_TIMEOUT_MS": "20000"},
    )
    warm = send_events(settings, 50)
    wait_for_outputs(settings, 50, proc=proc, log=log)

    client = redis.Redis.from_url(settings.redis.url)
    client.set(user_key(settings.redis.key_prefix, HUGE_USER), b"\x00" * HUGE_BYTES)
    client.close()
    codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    template = dict(warm.records[0])
    over = [_over(codec, template, limit + 1 + i, f"over-{i}") for i in range(5)]
    over.append(_over(codec, template, 900_000, "far-over"))  # under the producer's 1,000,000
    huge_user = [
        codec.encode({**template, "event_id": f"huge-user-{i}", "user_id": HUGE_USER})
        for i in range(4)
    ]
    _reset_peak(proc.pid)
    before = _memory_kib(proc.pid)["VmRSS"]
    sent = send_events(settings, 300, extra_values=over + huge_user)
    expected = 50 + 300 + len(huge_user)
    wait_for_outputs(settings, expected, proc=proc, log=log)
    dead = dead_letters(consumer_factory(settings.topics.dlq), expected=len(over))
    memory = _memory_kib(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0, failure_excerpt(log)

    recs = collect(settings, expected=expected)
    counts = Counter(r["event_id"] for r in recs)
    ids = warm.ids | sent.ids | {f"huge-user-{i}" for i in range(4)}
    assert set(counts) == ids and max(counts.values()) == 1  # nothing lost, nothing twice
    fallbacks = {r["event_id"]: r["fallback_features"] for r in recs}
    assert all("user_features" in fallbacks[f"huge-user-{i}"] for i in range(4))
    assert sorted(dict(m.headers() or [])[REASON_HEADER] for m in dead) == [
        RejectReason.OVERSIZED.value.encode()
    ] * len(over)
    assert "over redis.max_value_bytes" in log.read_text()

    # The client reads a reply whole (hiredis's buffer, then the bytes object): two copies of
    # the huge value at the peak. A third (joined into the decode buffer, as before) or one
    # kept after the batch breaks these bounds.
    huge_kib = HUGE_BYTES // 1024
    peak, after = memory["VmHWM"] - before, memory["VmRSS"] - before
    print(
        f"\nINPUT-BOUNDS rss_before_mib={before / 1024:.1f} peak_growth_mib={peak / 1024:.1f} "
        f"rss_growth_mib={after / 1024:.1f} huge_mib={huge_kib / 1024:.0f}"
    )
    assert peak < 2.5 * huge_kib
    assert after < 0.5 * huge_kib
