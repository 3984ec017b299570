"""``scoring_stage``: the pipeline's own stages from Avro bytes to encoded Recommendations.

Decode (the columnar decoder), enrichment from an in-process feature table (the synthetic
world, standing in for Redis), features, the copy to the device, forward, top-K, encode, with
the forward overlapped with preparing the next batch (the pipeline's ``ForwardExecutor``).
Needs the pipeline's dependencies (fastavro, pydantic, ...): where one is missing the section
says so (``skipped``) and the others still run.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from model.features.spec import FeatureSpec
from model.ranker import Ranker
from model.synthetic import SyntheticWorld
from scripts.gpucheck.common import sample_events
from scripts.gpucheck.model_sections import on_device

if TYPE_CHECKING:
    from pipeline.types import Checkpoint


class FeatureTable:
    """The synthetic world's user and item features in process memory (Redis stand-in)."""

    def __init__(self, world: SyntheticWorld) -> None:
        self._world = world

    def enrich(self, user_ids: np.ndarray, item_ids: np.ndarray) -> Any:
        from model.features.segments import flatten
        from pipeline.types import Enrichment

        world = self._world
        users, items = world.user_index_of(user_ids), world.item_index_of(item_ids)
        recent_counts, recent_ids = flatten([world.stored_recent_item_ids(int(u)) for u in users])
        return Enrichment(
            user_dense=world.user_dense[users],
            user_recent_counts=recent_counts,
            user_recent_ids=recent_ids,
            user_missing=np.zeros(len(users), bool),
            item_category=world.item_category[items],
            item_dense=world.item_dense[items],
            item_missing=np.zeros(len(items), bool),
        )


class NullProducer:
    """Takes every record and acknowledges it at once (no broker on the GPU machine): the
    sinks' producer (``produce_batch`` for the output, ``produce`` for the dead letters)."""

    def __init__(self) -> None:
        self.records = 0

    def produce_batch(
        self, topic: str, values: list[bytes], keys: list[bytes], acks: Checkpoint
    ) -> None:
        self.records += len(values)
        acks.pending -= len(values)

    def produce(self, topic: str, value: Any, key: Any, headers: Any, acks: Checkpoint) -> None:
        self.records += 1
        acks.pending -= 1


def scoring_stage(
    ranker: Ranker,
    world: SyntheticWorld,
    spec: FeatureSpec,
    device: torch.device,
    rows: int,
    batches: int,
) -> dict:
    """The pipeline's own path from Avro bytes to produced Recommendations, overlapped: its
    decode stage, then its BatchProcessor (enrich, features, copy, forward and top-K on the
    scoring thread, encode, produce), with the stage times of its own metrics."""
    try:
        from model.serving import Scorer
        from model.synthetic import to_event_dicts
        from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE, RecordCodec
        from pipeline.observability.metrics import Metrics
        from pipeline.observability.summary import RunSummary
        from pipeline.runtime.processor import BatchProcessor
        from pipeline.settings.codec import CodecSettings
        from pipeline.stages.dead_letter import DeadLetterSink
        from pipeline.stages.decode import MessageDecoder
        from pipeline.stages.publish import RecommendationSink
        from pipeline.stages.score import ForwardExecutor
        from pipeline.types import Batch, Checkpoint
    except ImportError as exc:  # the GPU machine lacks a serving dependency
        return {"skipped": f"missing {exc.name}"}

    encoder = RecordCodec(CodecSettings(), USER_EVENT_SCHEMA_FILE, "in")
    payloads = [
        [encoder.encode(e) for e in to_event_dicts(sample_events(world, rows, seed=b), world)]
        for b in range(batches)
    ]
    decoder = MessageDecoder(CodecSettings(), recent_cap=spec.recent_items_cap)
    scorer = Scorer(on_device(ranker, spec, device), spec, "gpu-check", device)
    producer = NullProducer()

    def processor(metrics: Metrics) -> BatchProcessor:
        return BatchProcessor(
            FeatureTable(world),
            ForwardExecutor(scorer, metrics, warm_up_rows=(rows,)),
            RecommendationSink(producer, "out", b"", metrics),  # type: ignore[arg-type]
            DeadLetterSink(producer, "dlq", metrics),  # type: ignore[arg-type]
            metrics,
            RunSummary(),
            overlap=True,
        )

    def run(processor: BatchProcessor, values_per_batch: list[list[bytes]]) -> float:
        decode_s = 0.0
        for values in values_per_batch:
            start = time.perf_counter()
            events, _, _ = decoder.decode_values(list(values))
            decode_s += time.perf_counter() - start
            processor.submit(Batch(events, [None] * events.num_events, Checkpoint()))
        processor.collect(wait=True)
        return decode_s

    warm = processor(Metrics())  # untimed: kernels compile, the model warms up on its thread
    run(warm, payloads[:1])
    warm.close()
    metrics = Metrics()
    timed = processor(metrics)
    producer.records = 0
    start_all = time.perf_counter()
    decode_s = run(timed, payloads)
    elapsed = time.perf_counter() - start_all
    timed.close()
    stage_s = {"decode": decode_s} | {
        stage: metrics.registry.get_sample_value(
            "streamrank_stage_duration_seconds_sum", {"stage": stage}
        )
        or 0.0
        for stage in ("enrich", "features", "forward", "produce")
    }
    events_total = sum(len(v) for v in payloads)
    rows_total = int(metrics.registry.get_sample_value("streamrank_batch_rows_sum") or 0)
    return {
        "batches": batches,
        "rows_per_batch": round(rows_total / batches),
        "events_per_s": round(events_total / elapsed),
        "rows_per_s": round(rows_total / elapsed),
        "recommendations_produced": producer.records,
        "seconds_per_stage": {k: round(v, 4) for k, v in stage_s.items()},
        "note": "forward runs on the scoring thread, overlapped with the next batch's host work",
    }
