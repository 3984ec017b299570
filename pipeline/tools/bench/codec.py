"""``streamrank bench codec``: fastavro per event vs the columnar kernels, decode and encode.

No stack needed: synthetic events are encoded once, then each round decodes them in batches of
``batch_events`` with (a) ``ReferenceDecoder`` per message + ``records_to_columns`` (the
reference) and (b) the decode stage's kernels (``MessageDecoder``); and encodes their
Recommendations with (a) one dict + fastavro per event and (b) the columnar encoder. CPU time
of this thread, µs per event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.connectors.avro.reference import (
    RECOMMENDATION_SCHEMA_FILE,
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
    ReferenceDecoder,
    records_to_columns,
)
from pipeline.observability.metrics import Metrics
from pipeline.settings.loading import Settings
from pipeline.stages.decode import MessageDecoder
from pipeline.stages.publish import FallbackFlags, RecommendationSink
from pipeline.tools.synthetic_io import build_world, to_event_dicts
from pipeline.types import EventColumns, ScoredBatch


def _us_per_event(work: Callable[[], object], events: int) -> float:
    start = time.thread_time()
    work()
    return round((time.thread_time() - start) / events * 1e6, 2)


def _top10(events: EventColumns) -> ScoredBatch:
    counts = np.minimum(events.candidate_counts, 10)
    rows = int(counts.sum())
    return ScoredBatch(
        counts=counts, item_ids=np.arange(rows), scores=np.full(rows, 0.5), model_version="m-1"
    )


def _fastavro_encode(codec: RecordCodec, events: EventColumns, scored: ScoredBatch) -> list[bytes]:
    bounds = np.concatenate([[0], np.cumsum(scored.counts)]).tolist()
    values = []
    for e, (event_id, user_id) in enumerate(
        zip(events.event_ids(), events.user_ids.tolist(), strict=True)
    ):
        items = range(bounds[e], bounds[e + 1])
        record = {
            "event_id": event_id,
            "user_id": user_id,
            "items": [{"item_id": i, "score": 0.5} for i in items],
            "model_version": "m-1",
            "scored_at": 0,
            "fallback_features": [],
        }
        values.append(codec.encode(record))
    return values


def bench_codec(
    settings: Settings, *, events: int, batch_events: int, rounds: int
) -> dict[str, Any]:
    """Interleaved rounds of reference vs columnar decode and encode (see the module doc).

    Returns:
        Per round, µs of CPU per event for each of the four, and the median ratios.

    Example::

        bench_codec(Settings(), events=7000, batch_events=70, rounds=3)
    """
    world = build_world(settings)
    user_codec = RecordCodec(settings.codec, USER_EVENT_SCHEMA_FILE, "bench-events")
    records = list(to_event_dicts(world.sample_events(events, np.random.default_rng(0)), world))
    now_ms = int(time.time() * 1000)  # the decoders reject times before 1973 or far ahead
    values: list[bytes | None] = [user_codec.encode({**r, "event_time": now_ms}) for r in records]
    batches = [values[i : i + batch_events] for i in range(0, len(values), batch_events)]
    cap = settings.model.recent_items_cap
    reference, columnar = (
        ReferenceDecoder(settings.codec, cap),
        MessageDecoder(settings.codec, cap),
    )
    decoded = [columnar.decode_values(b)[0] for b in batches]
    scored = [_top10(cols) for cols in decoded]
    rec_codec = RecordCodec(settings.codec, RECOMMENDATION_SCHEMA_FILE, "bench-recs")
    sink = RecommendationSink(None, "bench-recs", rec_codec.header, Metrics())  # type: ignore[arg-type]
    no_flags = [
        FallbackFlags(np.zeros(c.num_events, bool), np.zeros(c.num_events, bool)) for c in decoded
    ]
    out: dict[str, list[float]] = {k: [] for k in ("decode_fastavro", "decode_columnar")}
    out.update({"encode_fastavro": [], "encode_columnar": []})
    for _ in range(rounds):
        out["decode_fastavro"].append(
            _us_per_event(
                lambda: [records_to_columns([reference.decode(v) for v in b]) for b in batches],
                events,
            )
        )
        out["decode_columnar"].append(
            _us_per_event(lambda: [columnar.decode_values(b) for b in batches], events)
        )
        out["encode_fastavro"].append(
            _us_per_event(
                lambda: [
                    _fastavro_encode(rec_codec, c, s) for c, s in zip(decoded, scored, strict=True)
                ],
                events,
            )
        )
        out["encode_columnar"].append(
            _us_per_event(
                lambda: [
                    sink.encode(c, s, f, 0)
                    for c, s, f in zip(decoded, scored, no_flags, strict=True)
                ],
                events,
            )
        )
    ratio = {
        "decode_speedup": round(
            float(np.median(out["decode_fastavro"]) / np.median(out["decode_columnar"])), 1
        ),
        "encode_speedup": round(
            float(np.median(out["encode_fastavro"]) / np.median(out["encode_columnar"])), 1
        ),
    }
    return {"events": events, "batch_events": batch_events, "us_per_event": out, **ratio}
