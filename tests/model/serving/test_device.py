"""Tests for model.device: one GPU per local rank, threads bound to it (torch.cuda faked)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import model.serving.device
from model.serving.device import DeviceUnavailableError, bind_thread, bound_device, rank_device


class FakeCuda:
    """``torch.cuda`` as a host with ``count`` GPUs sees it; records ``set_device`` calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
        self.calls: list[tuple[int, torch.device]] = []  # (thread ident, device)
        self._current = threading.local()
        monkeypatch.setattr(model.serving.device, "_bound", [])
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", self.set_device)
        monkeypatch.setattr(torch.cuda, "current_device", self.current_device)

    def set_device(self, device: torch.device) -> None:
        self.calls.append((threading.get_ident(), device))
        self._current.index = device.index

    def current_device(self) -> int:
        return int(getattr(self._current, "index", 0))  # a fresh thread is on GPU 0


def test_each_local_rank_gets_its_own_gpu_made_current(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(monkeypatch, count=2)
    assert rank_device(0) == torch.device("cuda", 0)
    assert rank_device(1) == torch.device("cuda", 1)
    me = threading.get_ident()
    assert cuda.calls == [(me, torch.device("cuda", 0)), (me, torch.device("cuda", 1))]
    assert bound_device() == torch.device("cuda", 1)


@pytest.mark.parametrize("local_rank", [2, 3, -1])
def test_a_local_rank_without_its_own_gpu_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, local_rank: int
) -> None:
    # Before: local_rank % device_count() put rank 2 on GPU 0 next to rank 0.
    cuda = FakeCuda(monkeypatch, count=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(DeviceUnavailableError) as raised:
        rank_device(local_rank)
    message = str(raised.value)
    assert "\n" not in message
    assert f"local rank {local_rank}" in message and "2 visible GPU(s)" in message
    assert "CUDA_VISIBLE_DEVICES=0,1" in message and "at most 2 rank(s) per host" in message
    assert cuda.calls == [] and bound_device() is None


def test_no_cuda_means_the_cpu_and_no_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(monkeypatch, count=0)
    assert rank_device(5) == torch.device("cpu")
    bind_thread(torch.device("cpu"))
    assert cuda.calls == [] and bound_device() is None


def test_the_scoring_thread_binds_itself_once_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = FakeCuda(monkeypatch, count=2)
    device = torch.device("cuda", 1)
    with ThreadPoolExecutor(max_workers=1, initializer=bind_thread, initargs=(device,)) as pool:
        worker, current = pool.submit(
            lambda: (threading.get_ident(), torch.cuda.current_device())
        ).result()
        assert pool.submit(torch.cuda.current_device).result() == 1  # still bound
    assert worker != threading.get_ident()
    assert cuda.calls == [(worker, device)]  # once, on the worker
    assert current == 1
    assert torch.cuda.current_device() == 0  # the main thread was not moved
    assert bound_device() == device


def test_an_unindexed_cuda_device_means_the_one_bound_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cuda = FakeCuda(monkeypatch, count=2)
    rank_device(1)
    with ThreadPoolExecutor(
        max_workers=1, initializer=bind_thread, initargs=(torch.device("cuda"),)
    ) as pool:
        assert pool.submit(torch.cuda.current_device).result() == 1
    assert [device for _, device in cuda.calls] == [torch.device("cuda", 1)] * 2
