"""``scoring_stage``: the pipeline's own stages from Avro bytes to encoded Recommendations.

Decode (the columnar decoder), enrichment from an in-process feature table (the synthetic
world, standing in for Redis), features, the copy to the device, forward, top-K, encode, with
the forward overlapped with preparing the next batch (the pipeline's ``ForwardExecutor``).
Needs the pipeline's dependencies (fastavro, pydantic, ...): where one is missing the section
says so (``skipped``) and the others still run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from model.ranker import Ranker
from model.spec import FeatureSpec
from model.synthetic import SyntheticWorld
from scripts.gpucheck.common import sample_events
from scripts.gpucheck.model_sections import on_device


class FeatureTable:
    """The synthetic world's user and item features in process memory (Redis stand-in)."""

    def __init__(self, world: SyntheticWorld) -> None:
        self._world = world

    def enrich(self, user_ids: np.ndarray, item_ids: np.ndarray) -> Any:
        from pipeline.stages.enrich import Enrichment

        world = self._world
        users, items = world.user_index_of(user_ids), world.item_index_of(item_ids)
        return Enrichment(
            user_dense=world.user_dense[users],
            user_recent=[world.stored_recent_item_ids(int(u)) for u in users],
            user_missing=np.zeros(len(users), bool),
            item_category=world.item_category[items],
            item_dense=world.item_dense[items],
            item_missing=np.zeros(len(items), bool),
        )


def scoring_stage(
    ranker: Ranker,
    world: SyntheticWorld,
    spec: FeatureSpec,
    device: torch.device,
    rows: int,
    batches: int,
) -> dict:
    """The pipeline's stages from Avro bytes to encoded Recommendations, overlapped."""
    try:
        from model.synthetic import to_event_dicts
        from pipeline.config import CodecSettings
        from pipeline.metrics import Metrics
        from pipeline.stages.columnar import ColumnarDecoder
        from pipeline.stages.commit import Checkpoint
        from pipeline.stages.decode import (
            RECOMMENDATION_SCHEMA_FILE,
            USER_EVENT_SCHEMA_FILE,
            RecordCodec,
        )
        from pipeline.stages.features import build_feature_columns, fallback_flags
        from pipeline.stages.publish import RecommendationSink
        from pipeline.stages.score import ForwardExecutor, PreparedBatch, ScoredBatch, Scorer
    except ImportError as exc:  # the GPU machine lacks a serving dependency
        return {"skipped": f"missing {exc.name}"}

    encoder = RecordCodec(CodecSettings(), USER_EVENT_SCHEMA_FILE, "in")
    payloads = [
        [encoder.encode(e) for e in to_event_dicts(sample_events(world, rows, seed=b), world)]
        for b in range(batches)
    ]
    decoder = ColumnarDecoder(CodecSettings(), recent_cap=spec.recent_items_cap)
    out_codec = RecordCodec(CodecSettings(), RECOMMENDATION_SCHEMA_FILE, "out")
    # The pipeline's own columnar encoder; nothing is produced (no producer).
    sink = RecommendationSink(None, "out", out_codec, Metrics())  # type: ignore[arg-type]
    table = FeatureTable(world)
    scorer = Scorer(on_device(ranker, spec, device), spec, "gpu-check", device)
    stage_s = dict.fromkeys(
        ("decode", "enrich", "features", "stage", "forward_top_k", "encode"), 0.0
    )
    encoded = 0

    def publish(batch: PreparedBatch, scored: ScoredBatch) -> None:
        nonlocal encoded
        start = time.perf_counter()
        flags = fallback_flags(batch.events, batch.enrichment)
        encoded += len(sink.encode(batch.events, scored, flags, "gpu-check", 0))
        stage_s["encode"] += time.perf_counter() - start

    executor = ForwardExecutor(scorer, Metrics(), publish, overlap=True, collective=False)
    # Untimed warm-up: the columnar kernels compile on first use (cached after).
    warm = decoder.decode(payloads[0][:1]).columns
    warm_enrichment = table.enrich(warm.user_ids, warm.candidate_ids)
    executor.submit(
        PreparedBatch(
            warm,
            warm_enrichment,
            Checkpoint(),
            scorer.stage(build_feature_columns(warm, warm_enrichment, spec)),
        )
    )
    executor.finish()
    stage_s = dict.fromkeys(stage_s, 0.0)
    encoded = 0
    scored_rows = 0
    start_all = time.perf_counter()
    for values in payloads:
        t0 = time.perf_counter()
        events = decoder.decode(values).columns
        t1 = time.perf_counter()
        enrichment = table.enrich(events.user_ids, events.candidate_ids)
        t2 = time.perf_counter()
        features = build_feature_columns(events, enrichment, spec)
        t3 = time.perf_counter()
        staged = scorer.stage(features)
        t4 = time.perf_counter()
        executor.submit(PreparedBatch(events, enrichment, Checkpoint(), staged))
        for name, seconds in zip(
            ("decode", "enrich", "features", "stage"),
            (t1 - t0, t2 - t1, t3 - t2, t4 - t3),
            strict=True,
        ):
            stage_s[name] += seconds
        scored_rows += events.num_rows
    executor.finish()
    executor.shutdown()
    elapsed = time.perf_counter() - start_all
    stage_s["forward_top_k"] = elapsed - sum(stage_s.values())  # the rest: waiting on the device
    events_total = sum(len(v) for v in payloads)
    return {
        "batches": batches,
        "rows_per_batch": round(scored_rows / batches),
        "events_per_s": round(events_total / elapsed),
        "rows_per_s": round(scored_rows / elapsed),
        "recommendations_encoded": encoded,
        "host_seconds_per_stage": {k: round(v, 4) for k, v in stage_s.items()},
    }
