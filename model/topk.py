"""Per-event top-K selection over a flat, event-major batch of scores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from model.segments import offsets, positions, segment_ids, starts

__all__ = ["TopK", "top_k_per_event"]


@dataclass
class TopK:
    """Flat top-K result for ``E`` events.

    Args:
        counts: int64[E] items kept per event, ``min(k_e, C_e)`` (0 when ``k_e <= 0``).
        row_index: int64[counts.sum()] batch row of each kept item, event-major and best first
            within an event; ``candidate_ids[row_index]`` gives the item ids.
        scores: [counts.sum()] the kept scores: float64 for float64 input, else float32.

    Example::

        top = top_k_per_event(probs, cols.candidate_counts, k)
        item_ids = cols.candidate_ids[top.row_index]
        for e, (a, b) in enumerate(zip(top.offsets[:-1], top.offsets[1:])):
            ...  # event e's results are item_ids[a:b], top.scores[a:b]
    """

    counts: npt.NDArray[np.int64]
    row_index: npt.NDArray[np.int64]
    scores: npt.NDArray[np.floating]

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """int64[E + 1] start of each event's results in the flat arrays, then the total."""
        return offsets(self.counts)


def top_k_per_event(
    scores: torch.Tensor,
    candidate_counts: npt.NDArray[np.int64],
    k_per_event: npt.NDArray[np.int64],
) -> TopK:
    """The best ``k_e`` rows of every event, vectorised.

    Scores are scattered into an ``[E, max C]`` matrix padded with ``-inf`` and sorted per event
    with a *stable* descending sort, then each event keeps its first ``min(k_e, C_e)`` entries.

    Ties: equal scores keep batch order (the lower row index ranks first), so the result is
    deterministic. Real ``-inf`` scores still rank before the padding and are returned when
    ``k_e`` reaches them. NaN scores sort first (torch's descending order); do not pass them.

    Args:
        scores: [R] scores (any float dtype, any device), rows event-major.
        candidate_counts: int64[E] rows per event; sums to ``R``.
        k_per_event: int64[E] results wanted per event (values ``<= 0`` give none;
            values above ``C_e`` give all ``C_e``).

    Returns:
        A :class:`TopK` of numpy arrays: the selection runs on the scores' device and only
        the kept scores and positions come back to the host.

    Raises:
        ValueError: on inconsistent shapes.

    Example::

        top = top_k_per_event(torch.tensor([0.1, 0.9, 0.5]), np.array([2, 1]), np.array([1, 5]))
        # top.counts == [1, 1]; top.row_index == [1, 2]; top.scores == [0.9, 0.5]
    """
    counts = np.asarray(candidate_counts, dtype=np.int64)
    wanted = np.asarray(k_per_event, dtype=np.int64)
    if scores.ndim != 1:
        raise ValueError(f"scores must be 1-d, got shape {tuple(scores.shape)}")
    if counts.ndim != 1 or wanted.shape != counts.shape:
        raise ValueError(
            f"candidate_counts {counts.shape} and k_per_event {wanted.shape} must be equal 1-d"
        )
    if (counts < 0).any():
        raise ValueError("candidate_counts must be >= 0")
    num_rows = int(counts.sum())
    if scores.shape[0] != num_rows:
        raise ValueError(f"scores has {scores.shape[0]} rows, candidate_counts sum to {num_rows}")

    num_events = counts.shape[0]
    take = np.minimum(np.maximum(wanted, 0), counts)
    k_max = int(take.max()) if num_events else 0
    dtype = scores.dtype if scores.dtype in (torch.float32, torch.float64) else torch.float32
    np_dtype = torch.empty((), dtype=dtype).numpy().dtype
    if k_max == 0:
        return TopK(
            counts=take,
            row_index=np.zeros(0, dtype=np.int64),
            scores=np.zeros(0, dtype=np_dtype),
        )

    # On the scores' device: scatter into [E, max C] padded with -inf, stable sort per event,
    # keep the first k_max columns. Only those come back to the host, in one synchronisation.
    device = scores.device
    row_starts = starts(counts)
    row_event = segment_ids(counts)
    where = _upload(np.stack([row_event, positions(counts)]), device)
    padded = torch.full((num_events, int(counts.max())), float("-inf"), dtype=dtype, device=device)
    padded[where[0], where[1]] = scores.detach().to(dtype)
    sorted_t, sorted_pos_t = torch.sort(padded, dim=1, descending=True, stable=True)
    sorted_scores, sorted_pos = _download(sorted_t[:, :k_max], sorted_pos_t[:, :k_max])

    keep = np.arange(k_max, dtype=np.int64)[None, :] < take[:, None]
    row_index = (sorted_pos + row_starts[:, None])[keep]
    return TopK(counts=take, row_index=row_index.astype(np.int64), scores=sorted_scores[keep])


def _upload(array: npt.NDArray[np.int64], device: torch.device) -> torch.Tensor:
    """A host index array on ``device`` (asynchronously, through pinned memory, on a GPU)."""
    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def _download(*tensors: torch.Tensor) -> list[npt.NDArray[Any]]:
    """``tensors`` as numpy arrays; on a GPU, pinned asynchronous copies and ONE synchronisation
    (the batch's only one: reading its results)."""
    if not tensors or tensors[0].device.type != "cuda":
        return [t.cpu().numpy() for t in tensors]
    hosts = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    for host, tensor in zip(hosts, tensors, strict=True):
        host.copy_(tensor, non_blocking=True)
    torch.cuda.current_stream(tensors[0].device).synchronize()
    return [host.numpy() for host in hosts]
