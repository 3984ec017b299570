"""The audit of the compose check (scripts/compose_check.sh): what the running compose stack did,
read from Kafka and Prometheus, not from streamrank's own counters.

It runs inside the compose network, in a one-off container of the streamrank image with the
repository mounted at /src (``PYTHONPATH=/src``): Kafka is only reachable there (its advertised
listener is ``kafka:9092``), and the image has the Kafka and Avro clients. Settings are the
container's ``STREAMRANK_*`` variables (docker/compose.yaml); Prometheus is ``PROMETHEUS_URL``
(default ``http://prometheus:9090``). Subcommands print ``audit: ...`` lines and exit 1 when
what they check does not hold:

    group --members N         the consumer group has N members owning every input partition
    versions --expect V --ranks R --replica IP...   every rank of every replica serves model
                              version V (Prometheus)
    prometheus --ranks R --replica IP...   every rank's target up; every dashboard query and
                              alert expression of docker/ returns data (tests/docker/promql.py)
    drained                   the group's committed offsets reached the input topic's end
    final --guarantee G       every event the producer wrote is scored once, every malformed
                              message is dead-lettered once with its reason

Usage (what compose_check.sh runs): ``python /src/scripts/compose_audit.py SUBCOMMAND ...``.
A replica is a scorer container (its IP); rank r of it serves metrics on ``METRICS_PORT + r``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

PROMETHEUS_URL = os.environ.get("PROMETHEUS_URL", "http://prometheus:9090")
METRICS_PORT = int(os.environ.get("STREAMRANK_METRICS__PORT", "9464"))
SPEED_ALERTS = {"StreamrankP99LatencyOverSLO", "StreamrankConsumerLagGrowing"}
"""Alerts on how fast the stack scores: on a shared, loaded machine they may fire without
anything being wrong, so the audit reports them and fails only on the others."""


def say(line: str) -> None:
    """One ``audit:`` line on stdout, at once (the check shows it as it comes)."""
    print(f"audit: {line}", flush=True)


# ---------------------------------------------------------------------------- the counting


@dataclass(frozen=True)
class InputMessage:
    """One message of the input topic, as the audit classifies it."""

    partition: int
    offset: int
    event_id: str | None
    """The event's id when it is a valid event, else ``None`` (malformed)."""


@dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic: where its message came from, and why."""

    partition: int
    offset: int
    reason: str


@dataclass
class Audit:
    """What the topics say, counted (:func:`audit_topics`)."""

    sent: int
    """Valid events on the input topic."""
    malformed: int
    """Malformed messages on the input topic."""
    scored: int
    """Valid events with at least one Recommendation."""
    missing: int
    """Valid events with none."""
    duplicates: int
    """Recommendations beyond the first of their event."""
    dead_lettered: int
    """Records on the dead-letter topic."""
    malformed_not_dead_lettered: int
    dead_letter_duplicates: int
    """Dead-letter records beyond the first of their input message."""
    valid_dead_lettered: int
    """Valid events that went to the dead-letter topic (a scoring failure, not bad input)."""
    unknown_outputs: int
    """Recommendations whose event is not on the input topic."""
    reasons: Counter[str] = field(default_factory=Counter)
    """Dead letters by ``x-dlq-reason``."""
    versions: Counter[str] = field(default_factory=Counter)
    """Recommendations by the model version that scored them."""

    def problems(self, exactly_once: bool) -> list[str]:
        """What is wrong: nothing missing ever; no duplicate under exactly-once."""
        wrong = {
            "missing": self.missing,
            "malformed messages not dead-lettered": self.malformed_not_dead_lettered,
            "valid events dead-lettered": self.valid_dead_lettered,
            "recommendations of unknown events": self.unknown_outputs,
            "dead letters without a reason": self.reasons.get("", 0),
        }
        if exactly_once:
            wrong["duplicates"] = self.duplicates
            wrong["duplicate dead letters"] = self.dead_letter_duplicates
        if self.sent == 0:
            wrong["events sent (none)"] = 1
        return [f"{name}: {count}" for name, count in wrong.items() if count]


def audit_topics(
    inputs: Iterable[InputMessage],
    output_event_ids: Iterable[str],
    dead_letters: Iterable[DeadLetter],
    output_versions: Iterable[str] = (),
) -> Audit:
    """Match every input message with what the pipeline wrote for it.

    A valid event is answered by the Recommendations carrying its ``event_id``; a malformed
    message by the dead-letter records naming its partition and offset.

    Args:
        inputs: the input topic's messages.
        output_event_ids: the ``event_id`` of every Recommendation on the output topic.
        dead_letters: the dead-letter topic's records.
        output_versions: the ``model_version`` of every Recommendation.

    Returns:
        The counts.

    Example::

        audit_topics([InputMessage(0, 0, "e1")], ["e1"], []).missing  # 0
    """
    valid: dict[str, tuple[int, int]] = {}
    malformed: set[tuple[int, int]] = set()
    for message in inputs:
        where = (message.partition, message.offset)
        if message.event_id is None:
            malformed.add(where)
        else:
            valid[message.event_id] = where
    outputs = Counter(output_event_ids)
    letters = list(dead_letters)
    letter_count = Counter((d.partition, d.offset) for d in letters)
    valid_places = set(valid.values())
    return Audit(
        sent=len(valid),
        malformed=len(malformed),
        scored=sum(1 for event in valid if outputs[event]),
        missing=sum(1 for event in valid if not outputs[event]),
        duplicates=sum(n - 1 for event, n in outputs.items() if event in valid and n > 1),
        dead_lettered=len(letters),
        malformed_not_dead_lettered=sum(1 for where in malformed if not letter_count[where]),
        dead_letter_duplicates=sum(n - 1 for n in letter_count.values() if n > 1),
        valid_dead_lettered=sum(1 for where in letter_count if where in valid_places),
        unknown_outputs=sum(n for event, n in outputs.items() if event not in valid),
        reasons=Counter(d.reason for d in letters),
        versions=Counter(output_versions),
    )


# ----------------------------------------------------------------------- reading the topics


def _settings() -> Any:
    from pipeline.settings.loading import load_settings

    return load_settings()


def read_topic(settings: Any, topic: str, isolation_level: str) -> list[Any]:
    """Every message of ``topic`` from the beginning to each partition's end as it is now (the
    last stable offset under ``read_committed``), by assignment (no group joined)."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    from pipeline.connectors.kafka.clients import make_consumer

    consumer = make_consumer(
        settings.kafka.config,
        group_id=f"compose-audit-{uuid.uuid4().hex[:8]}",  # never joined: offsets are assigned
        extra={"isolation.level": isolation_level, "enable.partition.eof": True},
    )
    out: list[Any] = []
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        deadline = time.monotonic() + 300
        while at_end != set(partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(at_end)} of {partitions} read")
            for msg in consumer.consume(1000, 0.5):
                err, partition = msg.error(), int(msg.partition() or 0)
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(partition)
                    continue
                if err is not None:
                    raise RuntimeError(f"{topic}: {err}")
                at_end.discard(partition)
                out.append(msg)
    finally:
        consumer.close()
    return out


def classify_input(settings: Any, messages: list[Any]) -> list[InputMessage]:
    """The input topic's messages as valid events or malformed ones.

    Malformed is what ``streamrank produce --malformed`` writes among its events (the kinds of
    ``pipeline.tools.synthetic_io.malformed_values``): bytes that are no UserEvent (garbage,
    empty), ``num_results`` 0, a negative ``user_id``, or a value over
    ``codec.max_message_bytes``. The audit decides this itself, from the bytes.
    """
    from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec

    codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, settings.topics.input)
    limit = settings.codec.max_message_bytes
    out = []
    for msg in messages:
        value = msg.value() or b""
        event_id: str | None = None
        if value and len(value) <= limit:
            try:
                record = codec.decode(value)
            except Exception:
                record = None
            if record is not None and record["num_results"] > 0 and record["user_id"] >= 0:
                event_id = str(record["event_id"])
        out.append(InputMessage(msg.partition(), msg.offset(), event_id))
    return out


def _header(msg: Any, name: str) -> str:
    for key, value in msg.headers() or []:
        if key == name:
            return bytes(value or b"").decode("utf-8", "replace")
    return ""


def dead_letters(messages: list[Any]) -> list[DeadLetter]:
    """The dead-letter records' origins and reasons (pipeline/stages/dead_letter.py headers)."""
    return [
        DeadLetter(
            int(_header(m, "x-source-partition") or -1),
            int(_header(m, "x-source-offset") or -1),
            _header(m, "x-dlq-reason"),
        )
        for m in messages
    ]


# ------------------------------------------------------------------------------ subcommands


def _until(
    check: Callable[[], tuple[bool, str]], timeout_s: float, what: str, since: float | None = None
) -> bool:
    """Poll ``check`` every half second until it holds; print its last word either way.

    ``since``: the epoch time (``time.time()``) of what is waited for, e.g. the kill; the time
    printed is from then (else from the start of the wait)."""
    started = time.monotonic()
    origin = time.time() if since is None else since
    while True:
        try:
            ok, word = check()
        except Exception as error:  # a broker or Prometheus not answering yet: try again
            ok, word = False, f"{type(error).__name__}: {error}"
        if ok:
            say(f"{what} after {time.time() - origin:.1f} s: {word}")
            return True
        if time.monotonic() - started > timeout_s:
            say(f"FAILED: {what} not reached in {timeout_s:.0f} s: {word}")
            return False
        time.sleep(0.5)


def group(members: int, timeout_s: float, since: float | None = None) -> bool:
    """The group has ``members`` members that own every input partition between them."""
    from pipeline.connectors.kafka.admin import make_admin

    settings = _settings()
    admin = make_admin(settings.kafka.config)
    group_id, topic = settings.kafka.group_id, settings.topics.input

    def check() -> tuple[bool, str]:
        description = admin.describe_consumer_groups([group_id], request_timeout=10)[
            group_id
        ].result()
        owned = sorted(
            (
                f"{m.client_id}@{m.host.lstrip('/')}",
                sorted(tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic),
            )
            for m in description.members
        )
        total = sum(len(parts) for _, parts in owned)
        word = f"{len(owned)} member(s): " + "; ".join(
            f"{member} owns {parts}" for member, parts in owned
        )
        wanted = settings.topics.partitions
        return len(owned) == members and total == wanted and all(p for _, p in owned), word

    what = f"group {group_id}: {members} member(s) own {topic}"
    return _until(check, timeout_s, what, since)


def _prometheus(path: str, **params: str) -> Any:
    url = f"{PROMETHEUS_URL}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    if body.get("status") != "success":
        raise RuntimeError(f"{path}: {body}")
    return body["data"]


def _series(expr: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = _prometheus("/api/v1/query", query=expr)["result"]
    return result


def rank_targets(replicas: list[str], ranks: int) -> list[str]:
    """The metrics targets (``IP:port``) of every rank of every replica."""
    return [f"{ip}:{METRICS_PORT + rank}" for ip in replicas for rank in range(ranks)]


def _target_health(targets: list[str]) -> dict[str, str]:
    """Each target's health in Prometheus (``absent`` when it is not discovered)."""
    active = _prometheus("/api/v1/targets", state="active")["activeTargets"]
    health = {t["labels"].get("instance", ""): t["health"] for t in active}
    return {target: health.get(target, "absent") for target in targets}


def versions(
    expect: str, replicas: list[str], ranks: int, timeout_s: float, since: float | None = None
) -> bool:
    """Every rank's target reports ``streamrank_model_info{model_version=expect}``."""
    wanted = rank_targets(replicas, ranks)

    def check() -> tuple[bool, str]:
        served = {
            s["metric"].get("instance", ""): s["metric"].get("model_version", "")
            for s in _series('streamrank_model_info{job="streamrank"}')
        }
        now = {target: served.get(target, "none") for target in wanted}
        word = ", ".join(f"{target} serves {version}" for target, version in now.items())
        return all(version == expect for version in now.values()), word

    what = f"every rank of {len(replicas)} replicas on {expect}"
    return _until(check, timeout_s, what, since)


def prometheus(replicas: list[str], ranks: int, timeout_s: float) -> bool:
    """Every rank's target is up; every dashboard query and alert part returns data; every
    rule evaluates; no alert fires but those on speed (:data:`SPEED_ALERTS`)."""
    from tests.docker.promql import alert_queries, checked_parts, dashboard_queries

    targets = rank_targets(replicas, ranks)

    def targets_up() -> tuple[bool, str]:
        health = _target_health(targets)
        word = ", ".join(f"{target} {state}" for target, state in health.items())
        return all(state == "up" for state in health.values()), word

    what = f"targets up: {len(targets)} ({len(replicas)} scorer replicas x {ranks} ranks)"
    ok = _until(targets_up, timeout_s, what)
    panels = [q for q in dashboard_queries() if not q.gpu_only]
    gpu_panels = [q for q in dashboard_queries() if q.gpu_only]
    alerts = alert_queries()
    wanted = [(q.source, q.expr) for q in panels] + [
        (q.source, part) for q in alerts for part in checked_parts(q.expr)
    ]

    def answered() -> tuple[bool, str]:
        missing = [f"{source}: {expr}" for source, expr in wanted if not _series(expr)]
        return not missing, (
            f"{len(panels)} dashboard queries and {len(wanted) - len(panels)} alert parts "
            f"of {len(alerts)} rules return data"
            if not missing
            else "no data: " + " | ".join(missing)
        )

    ok = _until(answered, timeout_s, "dashboard and alert queries") and ok
    gpu_data = [q.source for q in gpu_panels if _series(q.expr)]
    say(
        f"{len(gpu_panels)} GPU-only dashboard queries: "
        + (f"data from {gpu_data}" if gpu_data else "no data (CPU scorers export none)")
    )
    rules = [r for g in _prometheus("/api/v1/rules")["groups"] for r in g["rules"]]
    unhealthy = [f"{r['name']}: {r.get('lastError', '')}" for r in rules if r["health"] != "ok"]
    firing = [r["name"] for r in rules if r.get("state") == "firing"]
    pending = [r["name"] for r in rules if r.get("state") == "pending"]
    say(
        f"rules: {len(rules)} loaded (alerts.yml has {len(alerts)}), "
        f"{len(rules) - len(unhealthy)} evaluate without error, firing {firing or 'none'}, "
        f"pending {pending or 'none'}"
    )
    wrong = [name for name in firing if name not in SPEED_ALERTS]
    if unhealthy:
        say("FAILED: rules with errors: " + "; ".join(unhealthy))
    if wrong:
        say(f"FAILED: alerts firing: {wrong}")
    if speed := sorted(set(firing) & SPEED_ALERTS):
        say(f"speed alerts firing on this machine (reported, not a failure): {speed}")
    return ok and len(rules) == len(alerts) and not unhealthy and not wrong


def drained(timeout_s: float) -> bool:
    """The group committed every input partition up to its end (nothing left to score)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    from pipeline.connectors.kafka.admin import make_admin

    settings = _settings()
    admin = make_admin(settings.kafka.config)
    topic, group_id = settings.topics.input, settings.kafka.group_id
    partitions = sorted(admin.list_topics(topic, timeout=30).topics[topic].partitions)

    def check() -> tuple[bool, str]:
        specs = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
        ends = {
            tp.partition: f.result().offset
            for tp, f in admin.list_offsets(specs, request_timeout=10).items()
        }
        request = [ConsumerGroupTopicPartitions(group_id, [TopicPartition(topic, p) for p in ends])]
        answer = admin.list_consumer_group_offsets(request, request_timeout=10)[group_id].result()
        committed = {tp.partition: tp.offset for tp in answer.topic_partitions}
        lag = sum(end - max(committed.get(p, 0), 0) for p, end in ends.items())
        return lag == 0, f"lag {lag} of {sum(ends.values())} input messages"

    return _until(check, timeout_s, f"group {group_id} drained {topic}")


def final(guarantee: str) -> bool:
    """Read the three topics back and count (:func:`audit_topics`)."""
    from pipeline.tools.recommendation_reader import recommendation_codec

    settings = _settings()
    topics = settings.topics
    inputs = classify_input(settings, read_topic(settings, topics.input, "read_uncommitted"))
    codec = recommendation_codec(settings)
    committed = [
        codec.decode(m.value()) for m in read_topic(settings, topics.output, "read_committed")
    ]
    everything = len(read_topic(settings, topics.output, "read_uncommitted"))
    letters = dead_letters(read_topic(settings, topics.dlq, "read_committed"))
    result = audit_topics(
        inputs,
        (r["event_id"] for r in committed),
        letters,
        (r["model_version"] for r in committed),
    )
    exactly_once = guarantee == "exactly_once"
    say(
        f"events sent {result.sent:,} (+ {result.malformed} malformed), scored {result.scored:,}, "
        f"missing {result.missing}, duplicates {result.duplicates}, "
        f"dead-lettered {result.dead_lettered} ({guarantee}; read_committed)"
    )
    say(
        "dead letters by reason: "
        + ", ".join(f"{reason or '(none)'} {n}" for reason, n in sorted(result.reasons.items()))
        + f"; malformed not dead-lettered {result.malformed_not_dead_lettered}, "
        f"dead-lettered twice {result.dead_letter_duplicates}, "
        f"valid events dead-lettered {result.valid_dead_lettered}"
    )
    say(
        "recommendations by model version: "
        + ", ".join(f"{v} {n:,}" for v, n in sorted(result.versions.items()))
    )
    say(
        f"output records {everything:,} read_uncommitted, {len(committed):,} read_committed: "
        f"{everything - len(committed)} in aborted transactions"
    )
    problems = result.problems(exactly_once)
    if problems:
        say("FAILED: " + "; ".join(problems))
    return not problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compose_audit", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("group")
    p.add_argument("--members", type=int, required=True)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--since", type=float, help="epoch time the wait is timed from")
    p = sub.add_parser("versions")
    p.add_argument("--expect", required=True)
    p.add_argument("--replica", action="append", required=True)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--since", type=float, help="epoch time the wait is timed from")
    p = sub.add_parser("prometheus")
    p.add_argument("--replica", action="append", required=True)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0)
    p = sub.add_parser("drained")
    p.add_argument("--timeout", type=float, default=300.0)
    p = sub.add_parser("final")
    p.add_argument("--guarantee", choices=["at_least_once", "exactly_once"], required=True)
    args = parser.parse_args(argv)
    if args.command == "group":
        ok = group(args.members, args.timeout, args.since)
    elif args.command == "versions":
        ok = versions(args.expect, args.replica, args.ranks, args.timeout, args.since)
    elif args.command == "prometheus":
        ok = prometheus(args.replica, args.ranks, args.timeout)
    elif args.command == "drained":
        ok = drained(args.timeout)
    else:
        ok = final(args.guarantee)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
