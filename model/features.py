"""Columnar features for a micro-batch and their conversion into the ranker's input.

The pipeline (and :mod:`model.synthetic`) collect each micro-batch as flat numpy columns,
:class:`FeatureColumns`; :func:`build_model_input` turns them into a dense tensor plus a TorchRec
``KeyedJaggedTensor`` in one compiled (numba) pass (no Python loop over rows or events).

Layout of a batch with ``E`` events and ``R = candidate_counts.sum()`` rows: rows are
event-major, i.e. the candidates of event 0, then those of event 1, and so on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numba
import numpy as np
import numpy.typing as npt
import torch

from model.model_input import ModelInput, sparse_features
from model.segments import offsets
from model.spec import _GOLDEN, _MIX1, _MIX2, SPARSE_FEATURE_ORDER, FeatureSpec

__all__ = ["FeatureColumns", "build_model_input"]

Int64Array = npt.NDArray[np.int64]
Float32Array = npt.NDArray[np.float32]


@dataclass
class FeatureColumns:
    """Raw (unhashed) features of one micro-batch, as numpy columns.

    ``E`` is the number of events and ``R = candidate_counts.sum()`` the number of rows.

    Args:
        user_ids: int64[E] raw user ids.
        device_ids: int64[E] raw device ids (:func:`model.spec.string_to_id` of the string).
        country_ids: int64[E] raw country ids (:func:`model.spec.string_to_id`).
        candidate_counts: int64[E] candidates per event.
        candidate_ids: int64[R] raw candidate item ids, event-major.
        recent_counts: int64[E] recent items per event (already capped by the caller).
        recent_ids: int64[recent_counts.sum()] raw recent item ids, event-major.
        user_dense: float32[E, user_dense_dim] the user's dense vector.
        item_category: int64[R] raw category id of each candidate.
        item_dense: float32[R, item_dense_dim] dense vector of each candidate.

    Example::

        cols = FeatureColumns(
            user_ids=np.array([10**12], dtype=np.int64),
            device_ids=np.array([string_to_id("ios")], dtype=np.int64),
            country_ids=np.array([string_to_id("DE")], dtype=np.int64),
            candidate_counts=np.array([2], dtype=np.int64),
            candidate_ids=np.array([5 * 10**12, 5 * 10**12 + 1], dtype=np.int64),
            recent_counts=np.array([1], dtype=np.int64),
            recent_ids=np.array([5 * 10**12 + 7], dtype=np.int64),
            user_dense=np.zeros((1, 8), dtype=np.float32),
            item_category=np.array([1000, 1001], dtype=np.int64),
            item_dense=np.zeros((2, 8), dtype=np.float32),
        )
        cols.validate(FeatureSpec())
    """

    user_ids: Int64Array
    device_ids: Int64Array
    country_ids: Int64Array
    candidate_counts: Int64Array
    candidate_ids: Int64Array
    recent_counts: Int64Array
    recent_ids: Int64Array
    user_dense: Float32Array
    item_category: Int64Array
    item_dense: Float32Array

    @property
    def num_events(self) -> int:
        """``E``, the number of events."""
        return int(self.user_ids.shape[0])

    @property
    def num_rows(self) -> int:
        """``R``, the number of (event, candidate) rows."""
        return int(self.candidate_ids.shape[0])

    def validate(self, spec: FeatureSpec) -> None:
        """Check dtypes, shapes and counts against each other and against ``spec``.

        Args:
            spec: supplies the dense widths and the recent-items cap.

        Raises:
            ValueError: naming the first offending column.
        """
        int_cols = (
            "user_ids",
            "device_ids",
            "country_ids",
            "candidate_counts",
            "candidate_ids",
            "recent_counts",
            "recent_ids",
            "item_category",
        )
        for name in int_cols:
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.dtype != np.int64 or arr.ndim != 1:
                raise ValueError(f"{name} must be a 1-d int64 numpy array, got {_describe(arr)}")
        for name in ("user_dense", "item_dense"):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray) or arr.dtype != np.float32 or arr.ndim != 2:
                raise ValueError(f"{name} must be a 2-d float32 numpy array, got {_describe(arr)}")
        num_events = self.num_events
        for name in ("device_ids", "country_ids", "candidate_counts", "recent_counts"):
            if getattr(self, name).shape[0] != num_events:
                raise ValueError(
                    f"{name} has {getattr(self, name).shape[0]} entries, expected one per event "
                    f"({num_events})"
                )
        if self.user_dense.shape != (num_events, spec.user_dense_dim):
            raise ValueError(
                f"user_dense has shape {self.user_dense.shape}, expected "
                f"({num_events}, {spec.user_dense_dim})"
            )
        if (self.candidate_counts < 0).any() or (self.recent_counts < 0).any():
            raise ValueError("candidate_counts and recent_counts must be >= 0")
        if (self.recent_counts > spec.recent_items_cap).any():
            raise ValueError(
                f"recent_counts exceed recent_items_cap={spec.recent_items_cap} "
                f"(max {int(self.recent_counts.max())}); cap before building columns"
            )
        num_rows = int(self.candidate_counts.sum())
        if self.num_rows != num_rows:
            raise ValueError(
                f"candidate_ids has {self.num_rows} entries, candidate_counts sum to {num_rows}"
            )
        if self.item_category.shape[0] != num_rows:
            raise ValueError(
                f"item_category has {self.item_category.shape[0]} entries, expected {num_rows}"
            )
        if self.item_dense.shape != (num_rows, spec.item_dense_dim):
            raise ValueError(
                f"item_dense has shape {self.item_dense.shape}, expected "
                f"({num_rows}, {spec.item_dense_dim})"
            )
        num_recent = int(self.recent_counts.sum())
        if self.recent_ids.shape[0] != num_recent:
            raise ValueError(
                f"recent_ids has {self.recent_ids.shape[0]} entries, recent_counts sum to "
                f"{num_recent}"
            )

    def slice_events(self, start: int, stop: int | None = None) -> FeatureColumns:
        """The columns of events ``start:stop`` (views where possible, no copies of ids).

        Args:
            start: first event (inclusive).
            stop: last event (exclusive); ``None`` for the end.

        Returns:
            A :class:`FeatureColumns` over that event range.

        Example::

            first_half = cols.slice_events(0, cols.num_events // 2)
        """
        start, stop, _ = slice(start, stop).indices(self.num_events)
        stop = max(stop, start)
        row_off = offsets(self.candidate_counts)
        rec_off = offsets(self.recent_counts)
        r0, r1 = int(row_off[start]), int(row_off[stop])
        q0, q1 = int(rec_off[start]), int(rec_off[stop])
        return FeatureColumns(
            user_ids=self.user_ids[start:stop],
            device_ids=self.device_ids[start:stop],
            country_ids=self.country_ids[start:stop],
            candidate_counts=self.candidate_counts[start:stop],
            candidate_ids=self.candidate_ids[r0:r1],
            recent_counts=self.recent_counts[start:stop],
            recent_ids=self.recent_ids[q0:q1],
            user_dense=self.user_dense[start:stop],
            item_category=self.item_category[r0:r1],
            item_dense=self.item_dense[r0:r1],
        )

    @classmethod
    def concat(cls, parts: Sequence[FeatureColumns]) -> FeatureColumns:
        """Concatenate batches event-wise (event order: ``parts[0]``'s events first).

        Args:
            parts: at least one :class:`FeatureColumns`.

        Returns:
            One :class:`FeatureColumns` holding every event of ``parts``.

        Example::

            both = FeatureColumns.concat([cols_a, cols_b])
            assert both.num_rows == cols_a.num_rows + cols_b.num_rows
        """
        if not parts:
            raise ValueError("concat needs at least one FeatureColumns")
        merged = {
            f.name: np.concatenate([getattr(p, f.name) for p in parts], axis=0) for f in fields(cls)
        }
        return cls(**merged)


def build_model_input(cols: FeatureColumns, spec: FeatureSpec) -> ModelInput:
    """Hash and lay out a batch's features for the ranker: one compiled pass, no per-row Python.

    Sparse layout (one bag per row per key, keys in ``spec.feature_names`` order):

    - ``user_id``, ``device``, ``country``: the event's value, one per row of the event.
    - ``item_id``, ``item_category``: the row's candidate and its category, one per row.
    - ``recent_items``: the event's whole recent list (``recent_counts[e]`` values, possibly
      zero) repeated for every row of the event.

    Every value is ``spec.hash_ids(feature, raw)``, a row of that feature's table. Dense is
    ``[user_dense[event(row)], item_dense[row]]``.

    Args:
        cols: the batch; :meth:`FeatureColumns.validate` is called first.
        spec: table sizes, hash salt and dense widths.

    Returns:
        A :class:`ModelInput` on the CPU.

    Raises:
        ValueError: if ``cols`` does not match ``spec``.

    Example::

        inp = build_model_input(cols, spec)
        assert inp.sparse.keys() == spec.feature_names
    """
    cols.validate(spec)
    num_rows = cols.num_rows
    sizes = np.array([spec.table(f).num_embeddings for f in SPARSE_FEATURE_ORDER], np.uint64)
    salt = np.uint64((int(_GOLDEN) * spec.hash_salt) & 0xFFFFFFFFFFFFFFFF)
    c = np.ascontiguousarray  # the kernel is compiled for contiguous columns
    values, lengths, dense, recent_total = _layout(
        c(cols.user_ids), c(cols.device_ids), c(cols.country_ids), c(cols.candidate_counts),
        c(cols.candidate_ids), c(cols.item_category), c(cols.recent_counts), c(cols.recent_ids),
        c(cols.user_dense), c(cols.item_dense), sizes, salt,
    )  # fmt: skip
    sparse = sparse_features(
        spec.feature_names,
        torch.from_numpy(values),
        torch.from_numpy(lengths),
        num_rows,
        length_per_key=[num_rows] * 5 + [recent_total],
    )
    return ModelInput(dense=torch.from_numpy(dense), sparse=sparse)


@numba.njit(cache=True, nogil=True)
def _hash(raw: int, salt: np.uint64, num_rows: np.uint64) -> int:
    """:func:`model.spec.hash_to_rows` of one id (its splitmix64 finaliser and constants, in
    uint64 arithmetic)."""
    z = np.uint64(raw) + salt
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return int(np.int64(z % num_rows))


@numba.njit(cache=True, nogil=True)
def _layout(
    user_ids: Int64Array,
    device_ids: Int64Array,
    country_ids: Int64Array,
    candidate_counts: Int64Array,
    candidate_ids: Int64Array,
    item_category: Int64Array,
    recent_counts: Int64Array,
    recent_ids: Int64Array,
    user_dense: Float32Array,
    item_dense: Float32Array,
    sizes: npt.NDArray[np.uint64],
    salt: np.uint64,
) -> tuple[Int64Array, Int64Array, Float32Array, int]:
    """The KJT's values and lengths (key-major, keys in :data:`SPARSE_FEATURE_ORDER`) and the
    dense matrix of a batch; also the number of ``recent_items`` values."""
    num_events, num_rows = len(user_ids), len(candidate_ids)
    user_dim, item_dim = user_dense.shape[1], item_dense.shape[1]
    recent_total = 0
    for e in range(num_events):
        recent_total += candidate_counts[e] * recent_counts[e]
    values = np.empty(5 * num_rows + recent_total, dtype=np.int64)
    lengths = np.ones(6 * num_rows, dtype=np.int64)
    dense = np.empty((num_rows, user_dim + item_dim), dtype=np.float32)
    recent = np.empty(len(recent_ids), dtype=np.int64)
    for q in range(len(recent_ids)):
        recent[q] = _hash(recent_ids[q], salt, sizes[5])
    row = 0
    first_recent = 0
    out = 5 * num_rows
    for e in range(num_events):
        user = _hash(user_ids[e], salt, sizes[0])
        device = _hash(device_ids[e], salt, sizes[3])
        country = _hash(country_ids[e], salt, sizes[4])
        n_recent = recent_counts[e]
        for _ in range(candidate_counts[e]):
            values[row] = user
            values[num_rows + row] = _hash(candidate_ids[row], salt, sizes[1])
            values[2 * num_rows + row] = _hash(item_category[row], salt, sizes[2])
            values[3 * num_rows + row] = device
            values[4 * num_rows + row] = country
            lengths[5 * num_rows + row] = n_recent
            for q in range(n_recent):
                values[out + q] = recent[first_recent + q]
            out += n_recent
            for j in range(user_dim):
                dense[row, j] = user_dense[e, j]
            for j in range(item_dim):
                dense[row, user_dim + j] = item_dense[row, j]
            row += 1
        first_recent += n_recent
    return values, lengths, dense, recent_total


def _describe(arr: object) -> str:
    if isinstance(arr, np.ndarray):
        return f"ndarray(dtype={arr.dtype}, shape={arr.shape})"
    return type(arr).__name__
