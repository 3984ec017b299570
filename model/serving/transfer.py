"""Host -> GPU copies of a batch's model input, overlapped with the forward of the previous one.

The serving loop builds batch n+1's input on the host while batch n's forward runs on the
scoring thread. :class:`DeviceTransfer` copies it into reused page-locked staging buffers and
from there to the GPU with non-blocking copies on a stream of its own; the forward of batch n+1
waits for that copy on the GPU (an event), never on the host. The batch's single
synchronisation is the read of its top-K results (:func:`model.serving.topk.top_k_per_event`).

On a CPU there is nothing to copy: the input is used where it was built (``StagedInput(inp)``).
Only torch and :mod:`model.features.model_input` are imported, so the GPU check can drive the
transfer without the pipeline's dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from model.features.model_input import ModelInput, sparse_features

__all__ = ["DeviceTransfer", "StagedInput"]


@dataclass
class StagedInput:
    """A batch's model input on the model's device, maybe still being copied.

    Attributes:
        model_input: the input (its tensors may not be filled yet: call :meth:`ready_input`).
        copied: recorded on the copy stream after the copy; ``None`` when nothing is copied.
    """

    model_input: ModelInput
    copied: torch.cuda.Event | None = None

    def ready_input(self) -> ModelInput:
        """The input, safe to use on the calling thread's current stream.

        The current stream waits for the copy (on the GPU, not the host), and the tensors are
        marked as used by it so the allocator does not hand their memory to the copy stream
        while the forward still reads them.
        """
        if self.copied is None:
            return self.model_input
        inp = self.model_input
        stream = torch.cuda.current_stream(inp.dense.device)
        stream.wait_event(self.copied)
        weights = inp.sparse.weights_or_none()
        extra = () if weights is None else (weights,)
        for tensor in (inp.dense, inp.sparse.values(), inp.sparse.lengths(), *extra):
            tensor.record_stream(stream)
        return inp


@dataclass
class _Slot:
    """Pinned host buffers for one batch in flight, and the event of their last copy."""

    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    copied: torch.cuda.Event | None = None

    def stage(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` copied into this slot's pinned buffer ``name`` (grown when too small)."""
        buffer = self.buffers.get(name)
        if buffer is None or buffer.dtype != tensor.dtype or buffer.numel() < tensor.numel():
            buffer = torch.empty(max(tensor.numel(), 1), dtype=tensor.dtype, pin_memory=True)
            self.buffers[name] = buffer
        view = buffer[: tensor.numel()].view(tensor.shape)
        view.copy_(tensor)
        return view


class DeviceTransfer:
    """Asynchronous host -> GPU copies through ``slots`` reused pinned staging buffers.

    Args:
        device: a CUDA device.
        slots: batches whose copies may be in flight at once (two: the one being scored and
            the next).

    Example::

        transfer = DeviceTransfer(torch.device("cuda:0"))
        staged = transfer.to_device(build_model_input(cols, spec))   # loop thread
        probs = score_probabilities(ranker, staged.ready_input())    # scoring thread
    """

    def __init__(self, device: torch.device, slots: int = 2) -> None:
        if device.type != "cuda":
            raise ValueError(f"DeviceTransfer copies to a CUDA device, not {device}")
        self.device = device
        self._stream = torch.cuda.Stream(device)
        self._slots = [_Slot() for _ in range(slots)]
        self._next = 0

    def to_device(self, inp: ModelInput) -> StagedInput:
        """Start copying ``inp`` (on the host) to the device; returns at once.

        Args:
            inp: the batch as :func:`model.features.build.build_model_input` built it.

        Returns:
            The device input and the event its consumer waits on.
        """
        slot = self._slots[self._next]
        self._next = (self._next + 1) % len(self._slots)
        if slot.copied is not None:
            slot.copied.synchronize()  # this slot's previous copy left its buffers long ago
        sparse = inp.sparse
        weights = sparse.weights_or_none()
        pinned = ModelInput(
            dense=slot.stage("dense", inp.dense),
            sparse=sparse_features(
                sparse.keys(),
                slot.stage("values", sparse.values()),
                slot.stage("lengths", sparse.lengths()),
                sparse.stride(),
                sparse.length_per_key_or_none(),
                None if weights is None else slot.stage("weights", weights),
            ),
        )
        with torch.cuda.stream(self._stream):
            on_device = pinned.to(self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self._stream)
        slot.copied = copied
        return StagedInput(on_device, copied)
