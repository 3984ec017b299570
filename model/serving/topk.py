"""Per-event top-K selection over a flat, event-major batch of scores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from model.features.segments import offsets, positions, segment_ids, starts
from model.kernels import kernel

__all__ = ["TopK", "top_k_per_event"]

_NUMPY_DTYPES: dict[torch.dtype, np.dtype[Any]] = {
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
}
"""The score dtypes kept as they are (any other float dtype is selected in float32)."""


@dataclass
class TopK:
    """Flat top-K result for ``E`` events.

    Args:
        counts: int64[E] items kept per event, ``min(k_e, C_e)`` (0 when ``k_e <= 0``).
        row_index: int64[counts.sum()] batch row of each kept item, event-major and best first
            within an event; ``candidate_ids[row_index]`` gives the item ids.
        scores: [counts.sum()] the kept scores: float64 for float64 input, else float32.
        tasks: [counts.sum(), P] the kept rows' task columns (as given, float32), gathered
            with the selection; ``None`` when none were given.

    Example::

        top = top_k_per_event(probs, cols.candidate_counts, k)
        item_ids = cols.candidate_ids[top.row_index]
        for e, (a, b) in enumerate(zip(top.offsets[:-1], top.offsets[1:])):
            ...  # event e's results are item_ids[a:b], top.scores[a:b]
    """

    counts: npt.NDArray[np.int64]
    row_index: npt.NDArray[np.int64]
    scores: npt.NDArray[np.floating]
    tasks: npt.NDArray[np.float32] | None = None

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        """int64[E + 1] start of each event's results in the flat arrays, then the total."""
        return offsets(self.counts)


def top_k_per_event(
    scores: torch.Tensor,
    candidate_counts: npt.NDArray[np.int64],
    k_per_event: npt.NDArray[np.int64],
    tasks: torch.Tensor | None = None,
) -> TopK:
    """The best ``k_e`` rows of every event, on the scores' device.

    On a GPU, scores are scattered into an ``[E, max C]`` matrix padded with ``-inf`` and sorted
    per event with a *stable* descending sort, then each event keeps its first
    ``min(k_e, C_e)`` entries. On the CPU one compiled pass (numba) does the same sort event by
    event, in place of those tensor calls.

    Ties: equal scores keep batch order (the lower row index ranks first), so the result is
    deterministic. Real ``-inf`` scores still rank before the padding and are returned when
    ``k_e`` reaches them. NaN scores sort first (torch's descending order); do not pass them.

    Args:
        scores: [R] scores (any float dtype, any device), rows event-major.
        candidate_counts: int64[E] rows per event; sums to ``R``.
        k_per_event: int64[E] results wanted per event (values ``<= 0`` give none;
            values above ``C_e`` give all ``C_e``).
        tasks: [R, P] other columns of the rows (a multi-task module's published task
            scores), on the scores' device: the kept rows' come back with the selection (on a
            GPU gathered there, in the same synchronisation); ``None``: none.

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
    take, num_rows, k_max = _takes(counts, wanted)
    if num_rows < 0:
        raise ValueError("candidate_counts must be >= 0")
    if scores.shape[0] != num_rows:
        raise ValueError(f"scores has {scores.shape[0]} rows, candidate_counts sum to {num_rows}")
    if tasks is not None and (tasks.ndim != 2 or tasks.shape[0] != num_rows):
        raise ValueError(f"tasks must be [{num_rows}, P], got shape {tuple(tasks.shape)}")

    dtype = scores.dtype if scores.dtype in _NUMPY_DTYPES else torch.float32
    tasks = None if tasks is None else tasks.detach().float()
    if k_max == 0:
        return TopK(
            counts=take,
            row_index=np.zeros(0, dtype=np.int64),
            scores=np.zeros(0, dtype=_NUMPY_DTYPES[dtype]),
            tasks=None if tasks is None else np.zeros((0, tasks.shape[1]), dtype=np.float32),
        )
    if scores.device.type == "cpu":
        return _host_top_k(scores.detach().to(dtype), counts, take, tasks)
    return _device_top_k(scores.detach().to(dtype), counts, take, k_max, tasks)


def _host_top_k(
    scores: torch.Tensor,
    counts: npt.NDArray[np.int64],
    take: npt.NDArray[np.int64],
    tasks: torch.Tensor | None = None,
) -> TopK:
    """On the CPU: one compiled pass over the scores (no tensor calls)."""
    row_index, kept = _sorted_heads(scores.contiguous().numpy(), counts, take)
    kept_tasks = None if tasks is None else tasks.numpy()[row_index]
    return TopK(counts=take, row_index=row_index, scores=kept, tasks=kept_tasks)


def _device_top_k(
    scores: torch.Tensor,
    counts: npt.NDArray[np.int64],
    take: npt.NDArray[np.int64],
    k_max: int,
    tasks: torch.Tensor | None = None,
) -> TopK:
    """On the scores' device: scatter into [E, max C] padded with -inf, stable sort per event,
    keep the first ``k_max`` columns (and gather the task columns of their rows there). Only
    those come back to the host, in one synchronisation."""
    device = scores.device
    row_starts = starts(counts)
    row_event = segment_ids(counts)
    where = _upload(np.stack([row_event, positions(counts)]), device)
    padded = torch.full(
        (len(counts), int(counts.max())), float("-inf"), dtype=scores.dtype, device=device
    )
    padded[where[0], where[1]] = scores
    sorted_t, sorted_pos_t = torch.sort(padded, dim=1, descending=True, stable=True)
    heads, head_pos = sorted_t[:, :k_max], sorted_pos_t[:, :k_max]
    if tasks is None:
        sorted_scores, sorted_pos = _download(heads, head_pos)
    else:  # each head's row (padding heads clamped to a real row, dropped below)
        first = _upload(row_starts, device)
        rows = (head_pos + first[:, None]).clamp_(max=len(scores) - 1)
        sorted_scores, sorted_pos, head_tasks = _download(heads, head_pos, tasks[rows])

    keep = np.arange(k_max, dtype=np.int64)[None, :] < take[:, None]
    row_index = (sorted_pos + row_starts[:, None])[keep]
    return TopK(
        counts=take,
        row_index=row_index.astype(np.int64),
        scores=sorted_scores[keep],
        tasks=None if tasks is None else head_tasks[keep],
    )


@kernel
def _takes(
    counts: npt.NDArray[np.int64], wanted: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], int, int]:
    """Per event, the rows it keeps (``wanted`` clipped to ``[0, count]``); the rows in all
    (-1 when a count is negative) and the most any event keeps."""
    take = np.empty(len(counts), dtype=np.int64)
    rows = k_max = 0
    for e in range(len(counts)):
        if counts[e] < 0:
            return take, -1, 0
        take[e] = min(max(wanted[e], 0), counts[e])
        rows += counts[e]
        k_max = max(k_max, take[e])
    return take, rows, k_max


@kernel
def _before(a: float, b: float) -> bool:
    """Whether score ``a`` ranks before ``b``: higher first, NaN before everything (torch's
    descending order); equal scores do not (they keep batch order)."""
    return a > b or (a != a and b == b)


_INSERTION_MAX_K = 32
"""Up to this many results an event's best rows are kept by insertion (about one comparison per
row); beyond it the event's rows are merge sorted (no quadratic worst case)."""


@kernel
def _sorted_heads(
    scores: npt.NDArray[np.floating], counts: npt.NDArray[np.int64], take: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.floating]]:
    """Per event, its first ``take[e]`` rows in the order of a stable sort by :func:`_before`."""
    row_index = np.empty(take.sum(), dtype=np.int64)
    longest = counts.max() if len(counts) else 0
    order, spare = np.empty(longest, dtype=np.int64), np.empty(longest, dtype=np.int64)
    start = out = 0
    for e in range(len(counts)):
        c, k = counts[e], take[e]
        if k > _INSERTION_MAX_K:
            _merge_sort(scores, start, c, order, spare, row_index, out, k)
        elif k > 0:
            _insert_best(scores, start, c, k, row_index, out)
        out += k
        start += c
    kept = np.empty(len(row_index), dtype=scores.dtype)
    for i in range(len(row_index)):
        kept[i] = scores[row_index[i]]
    return row_index, kept


@kernel
def _insert_best(
    scores: npt.NDArray[np.floating],
    start: int,
    count: int,
    k: int,
    out: npt.NDArray[np.int64],
    at: int,
) -> None:
    """The best ``k`` of rows ``start .. start + count - 1`` into ``out[at : at + k]``, best
    first: each row goes in after every kept row that is not worse (stable)."""
    size = 0
    for row in range(start, start + count):
        score = scores[row]
        if size == k and not _before(score, scores[out[at + k - 1]]):
            continue
        j = min(size, k - 1)
        while j > 0 and _before(score, scores[out[at + j - 1]]):
            out[at + j] = out[at + j - 1]
            j -= 1
        out[at + j] = row
        size = min(size + 1, k)


@kernel
def _merge_sort(
    scores: npt.NDArray[np.floating],
    start: int,
    count: int,
    order: npt.NDArray[np.int64],
    spare: npt.NDArray[np.int64],
    out: npt.NDArray[np.int64],
    at: int,
    k: int,
) -> None:
    """Rows ``start .. start + count - 1`` stably sorted by :func:`_before` (``order`` and
    ``spare``: scratch of at least ``count``); the first ``k`` into ``out[at : at + k]``."""
    a, b = order, spare
    for i in range(count):
        a[i] = start + i
    width = 1
    while width < count:
        for lo in range(0, count, 2 * width):
            mid, hi = min(lo + width, count), min(lo + 2 * width, count)
            i, j = lo, mid
            for t in range(lo, hi):
                if j < hi and (i >= mid or _before(scores[a[j]], scores[a[i]])):
                    b[t] = a[j]
                    j += 1
                else:
                    b[t] = a[i]
                    i += 1
        a, b = b, a
        width *= 2
    out[at : at + k] = a[:k]


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
