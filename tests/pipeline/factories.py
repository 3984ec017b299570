"""Factories for stage and loop unit tests: encoded events, a tiny scorer, a fake enricher."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from confluent_kafka import Message

from model.features.build import build_model_input
from model.features.spec import FeatureSpec
from model.ranker import build_ranker
from model.serving import Scorer
from model.serving.transfer import StagedInput
from pipeline.connectors.avro.reference import (
    USER_EVENT_SCHEMA_FILE,
    RecordCodec,
    records_to_columns,
)
from pipeline.settings.codec import CodecSettings
from pipeline.stages.features import build_feature_columns
from pipeline.types import Batch, Checkpoint, Enrichment, EventColumns, PreparedBatch
from tests.pipeline.fakes import FakeMessage
from tests.support.specs import feature_tables

TINY_SPEC = FeatureSpec(
    tables=feature_tables(500, 500, 11, 8, 8, 500),
    embedding_dim=8,
    user_dense_dim=2,
    item_dense_dim=3,
    recent_items_cap=4,
    dense_arch=(16, 8),
    over_arch=(16, 1),
)
"""A model small enough that a forward costs nothing."""

_event_ids = itertools.count()


def tiny_scorer(spec: FeatureSpec = TINY_SPEC) -> Scorer:
    """A freshly initialised (deterministic) ranker on the CPU."""
    return Scorer(build_ranker(spec, seed=0), spec, "tiny-1", torch.device("cpu"))


def user_event(candidates: int = 3, user_id: int = 7, num_results: int = 2) -> dict[str, Any]:
    """A valid UserEvent record with ``candidates`` candidate items."""
    return {
        "event_id": f"ev-{next(_event_ids)}",
        "user_id": user_id,
        "event_time": dt.datetime.now(dt.UTC),
        "context": {"device": "ios", "country": "DE"},
        "candidate_item_ids": list(range(100, 100 + candidates)),
        "recent_item_ids": [1, 2],
        "num_results": num_results,
    }


def event_messages(
    topic: str, values: list[bytes | None], partition: int = 0, first_offset: int = 0
) -> list[Message]:
    """Consumed messages of one partition with consecutive offsets."""
    return [
        FakeMessage(topic, value, partition, first_offset + i) for i, value in enumerate(values)
    ]


def encode_events(records: list[dict[str, Any]]) -> list[bytes | None]:
    """Raw-framed Avro values of ``records``."""
    codec = RecordCodec(CodecSettings(), USER_EVENT_SCHEMA_FILE, "in")
    return [codec.encode(r) for r in records]


class DefaultsEnricher:
    """Serves default features for everything (as when Redis has nothing), counting calls."""

    def __init__(self, spec: FeatureSpec = TINY_SPEC) -> None:
        self._spec = spec
        self.calls = 0

    def enrich(
        self, user_ids: npt.NDArray[np.int64], item_ids: npt.NDArray[np.int64]
    ) -> Enrichment:
        self.calls += 1
        events, rows = len(user_ids), len(item_ids)
        return Enrichment(
            user_dense=np.zeros((events, self._spec.user_dense_dim), np.float32),
            user_recent_counts=np.zeros(events, np.int64),
            user_recent_ids=np.zeros(0, np.int64),
            user_missing=np.ones(events, bool),
            item_category=np.zeros(rows, np.int64),
            item_dense=np.zeros((rows, self._spec.item_dense_dim), np.float32),
            item_missing=np.ones(rows, bool),
        )


def columns(records: list[dict[str, Any]]) -> EventColumns:
    """``records`` (UserEvent dicts) as the decode stage's columns."""
    return records_to_columns(records)


def batch_of(records: list[dict[str, Any]], checkpoint: Checkpoint | None = None) -> Batch:
    """``records`` as a closed batch (fake source messages, one per event)."""
    events = records_to_columns(records)
    messages = event_messages("in", encode_events(records))
    return Batch(events, messages, checkpoint or Checkpoint())  # type: ignore[arg-type]


def prepared_batch(
    records: list[dict[str, Any]],
    scorer: Scorer | None = None,
    checkpoint: Checkpoint | None = None,
) -> PreparedBatch:
    """``records`` as the processor hands them to the forward (default features)."""
    scorer = scorer or tiny_scorer()
    batch = batch_of(records, checkpoint)
    events = batch.events
    enrichment = DefaultsEnricher(scorer.spec).enrich(events.user_ids, events.candidate_ids)
    features = build_feature_columns(events, enrichment, scorer.spec)
    return PreparedBatch(batch, enrichment, StagedInput(build_model_input(features, scorer.spec)))
