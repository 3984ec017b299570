"""Tests for model.serving.transfer: pinned, asynchronous host -> GPU copies of a batch's input.

On a CPU only the refusal and the no-copy path run; the copy itself runs where CUDA exists
(``make test-compat`` on the GPU machine, and the ``worker_transfer`` section of
scripts/gpu_check.py, which also counts synchronisations).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from model.features.build import FeatureColumns, build_model_input
from model.features.model_input import ModelInput
from model.features.spec import FeatureSpec
from model.serving.device import bind_thread
from model.serving.transfer import DeviceTransfer, StagedInput


def test_only_a_cuda_device_takes_copies() -> None:
    with pytest.raises(ValueError, match="CUDA device"):
        DeviceTransfer(torch.device("cpu"))


def test_an_input_already_in_place_is_used_as_is(spec: FeatureSpec, cols: FeatureColumns) -> None:
    inp = build_model_input(cols, spec)
    assert StagedInput(inp).ready_input() is inp


def _same(a: ModelInput, b: ModelInput) -> bool:
    return (
        torch.equal(a.dense, b.dense)
        and torch.equal(a.sparse.values(), b.sparse.values())
        and torch.equal(a.sparse.lengths(), b.sparse.lengths())
        and a.sparse.length_per_key() == b.sparse.length_per_key()
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_copies_read_on_a_worker_thread_equal_a_plain_to(
    spec: FeatureSpec, cols: FeatureColumns
) -> None:
    device = torch.device("cuda", torch.cuda.device_count() - 1)
    transfer = DeviceTransfer(device)
    # Sizes up and down: the slots' pinned buffers grow and are reused smaller.
    bounds = [(0, 2), (2, 40), (40, 41), (41, 64), (0, 64), (5, 9)]
    batches = [build_model_input(cols.slice_events(a, b), spec) for a, b in bounds]
    with ThreadPoolExecutor(1, initializer=bind_thread, initargs=(device,)) as worker:
        pending = None
        results = []
        for inp in batches:  # stage n+1 while n is read, as the serving loop does
            staged = transfer.to_device(inp)
            if pending is not None:
                results.append(pending.result())
            pending = worker.submit(lambda s=staged: s.ready_input().to("cpu"))
        assert pending is not None
        results.append(pending.result())
    assert all(_same(got, inp) for got, inp in zip(results, batches, strict=True))
