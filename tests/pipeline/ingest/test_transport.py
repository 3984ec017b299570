"""The shared-memory slots and the pipe between an ingest worker and its scoring server."""

from __future__ import annotations

import dataclasses
import threading
from multiprocessing import Pipe

import numpy as np
import pytest
import torch

from model.features.build import build_model_input
from model.features.model_input import ModelInput, sparse_features
from model.module.types import OutputConfig
from pipeline.ingest.transport import (
    ScoreReply,
    ScoreRequest,
    ServerGone,
    SharedSlot,
    SlotShape,
    StartConsuming,
    WorkerLink,
    WorkerReady,
)
from pipeline.stages.features import build_feature_columns
from tests.pipeline.factories import TINY_SPEC, DefaultsEnricher, columns, user_event
from tests.pipeline.ingest.configured import LAYOUT, TWO_TASKS, random_input


def _model_input(candidates: list[int]):  # type: ignore[no-untyped-def]
    events = columns([user_event(candidates=c, user_id=10 + i) for i, c in enumerate(candidates)])
    enrichment = DefaultsEnricher().enrich(events.user_ids, events.candidate_ids)
    return build_model_input(build_feature_columns(events, enrichment, TINY_SPEC), TINY_SPEC)


def test_a_slot_holds_the_largest_batch_of_its_shape() -> None:
    shape = SlotShape.for_spec(TINY_SPEC, max_rows=64)
    keys = len(TINY_SPEC.feature_names)
    assert shape.rows == 64
    # every key one value per row, recent items up to the cap per row
    assert shape.values == 64 * (keys + TINY_SPEC.recent_items_cap)
    assert shape.nbytes == 64 * (4 * TINY_SPEC.dense_dim + 8 * keys + 4) + 8 * shape.values


def test_what_a_worker_writes_the_server_reads_unchanged_without_a_copy() -> None:
    inp = _model_input([3, 5, 1])
    slot = SharedSlot.allocate(SlotShape.for_spec(TINY_SPEC, max_rows=32))
    assert slot.dense.is_shared() and slot.values.is_shared() and slot.scores.is_shared()

    request = slot.write(inp, index=1)
    assert request == ScoreRequest(1, 9, inp.sparse.values().numel(), request.length_per_key)
    assert list(request.length_per_key) == inp.sparse.length_per_key()
    read = slot.read(request, TINY_SPEC.feature_names)

    assert torch.equal(read.dense, inp.dense)
    assert torch.equal(read.sparse.values(), inp.sparse.values())
    assert torch.equal(read.sparse.lengths(), inp.sparse.lengths())
    assert read.sparse.keys() == inp.sparse.keys() and read.sparse.stride() == 9
    assert read.dense.data_ptr() == slot.dense.data_ptr()  # a view of the slot
    assert slot.holds(read) and not slot.holds(inp)


def test_a_batch_larger_than_its_slot_is_refused() -> None:
    slot = SharedSlot.allocate(SlotShape.for_spec(TINY_SPEC, max_rows=4))
    with pytest.raises(ValueError, match="does not fit an ingest slot"):
        slot.write(_model_input([3, 3]), index=0)


def test_a_request_waits_for_its_reply_while_metrics_go_out_from_another_thread() -> None:
    ours, theirs = Pipe(duplex=True)
    link = WorkerLink(theirs)
    seen: list[object] = []

    def server() -> None:
        while True:
            message = ours.recv()
            seen.append(message)
            if isinstance(message, WorkerReady):
                ours.send(StartConsuming())
            elif isinstance(message, ScoreRequest):
                ours.send(ScoreReply(message.slot))
                return

    thread = threading.Thread(target=server)
    thread.start()
    link.wait_for_start()
    link.send("metrics")
    assert link.score(ScoreRequest(1, 2, 3, (1, 1))) == ScoreReply(1)
    thread.join(10)
    assert seen == [WorkerReady(), "metrics", ScoreRequest(1, 2, 3, (1, 1))]


def test_a_closed_server_end_is_server_gone_not_an_event_error() -> None:
    ours, theirs = Pipe(duplex=True)
    link = WorkerLink(theirs)
    ours.close()
    with pytest.raises(ServerGone):
        link.score(ScoreRequest(0, 1, 1, (1,)))
    assert issubclass(ServerGone, OSError)  # never bisected as poison (pipeline.runtime.isolation)


def test_a_reply_to_another_slot_is_an_error() -> None:
    ours, theirs = Pipe(duplex=True)
    link = WorkerLink(theirs)
    ours.send(ScoreReply(1))
    with pytest.raises(RuntimeError, match="unexpected reply"):
        link.score(ScoreRequest(0, 1, 1, (1,)))
    np.testing.assert_equal(ours.recv(), ScoreRequest(0, 1, 1, (1,)))


def test_a_configured_models_slot_holds_its_layout_and_every_published_column() -> None:
    shape = SlotShape.for_model(LAYOUT, TWO_TASKS, max_rows=16)
    assert (shape.rows, shape.num_keys, shape.dense_dim) == (16, 3, 4)
    assert shape.values == 16 * (1 + 3 + 1)  # each key's most ids per row
    assert shape.score_columns == 3  # the ranking score, then click and purchase
    slot = SharedSlot.allocate(shape)
    assert slot.scores.shape == (16, 3) and slot.scores.is_shared()
    inp = random_input(16, seed=1)
    assert inp.sparse.values().numel() > 16  # several ids per row for some

    read = slot.read(slot.write(inp, index=0), LAYOUT.keys)

    assert torch.equal(read.dense, inp.dense)
    for key in LAYOUT.keys:
        mine, theirs = read.sparse[key], inp.sparse[key]
        assert torch.equal(mine.values(), theirs.values())
        assert torch.equal(mine.lengths(), theirs.lengths())
    # without task columns, one score per row as the built-in layout has
    plain = SlotShape.for_model(LAYOUT, OutputConfig(), max_rows=16)
    assert plain.score_columns == 1 and SharedSlot.allocate(plain).scores.shape == (16,)
    assert shape.nbytes == plain.nbytes + 4 * 16 * 2


def test_a_weighted_layouts_slot_carries_each_ids_weight() -> None:
    weighted = dataclasses.replace(LAYOUT, weighted=True)
    shape = SlotShape.for_layout(weighted, max_rows=16)
    assert shape.weighted and shape.nbytes == SlotShape.for_layout(LAYOUT, 16).nbytes + 4 * (
        shape.values
    )
    slot = SharedSlot.allocate(shape)
    assert slot.weights.is_shared() and slot.weights.numel() == shape.values
    inp = random_input(16, seed=2)
    sparse = inp.sparse
    weights = torch.rand(sparse.values().numel(), generator=torch.Generator().manual_seed(3))
    kjt = sparse_features(
        weighted.keys, sparse.values(), sparse.lengths(), 16, sparse.length_per_key(), weights
    )

    read = slot.read(slot.write(ModelInput(inp.dense, kjt), index=0), weighted.keys)

    assert torch.equal(read.sparse.weights(), weights)
    for key in weighted.keys:
        assert torch.equal(read.sparse[key].weights(), kjt[key].weights())
    # a KJT without weights (none of its keys weighted) weighs every id 1.0
    again = slot.read(slot.write(inp, index=0), weighted.keys)
    assert torch.equal(again.sparse.weights(), torch.ones(sparse.values().numel()))
    # an unweighted layout's slot carries none
    assert SharedSlot.allocate(SlotShape.for_layout(LAYOUT, 16)).weights.numel() == 0
    plain = SharedSlot.allocate(SlotShape.for_layout(LAYOUT, 16))
    assert plain.read(plain.write(inp, 0), LAYOUT.keys).sparse.weights_or_none() is None
