"""The columns of one micro-batch, as the pipeline and :mod:`model.synthetic` collect them.

:class:`FeatureColumns` is plain numpy (no torch): tools that only sample or write events use it
without importing the model; :func:`model.features.build.build_model_input` turns it into the
ranker's input.

Layout of a batch with ``E`` events and ``R = candidate_counts.sum()`` rows: rows are
event-major, i.e. the candidates of event 0, then those of event 1, and so on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from model.features.segments import offsets
from model.features.spec import FeatureSpec

__all__ = ["FeatureColumns", "Float32Array", "Int64Array"]

Int64Array = npt.NDArray[np.int64]
Float32Array = npt.NDArray[np.float32]


@dataclass
class FeatureColumns:
    """Raw (unhashed) features of one micro-batch, as numpy columns.

    ``E`` is the number of events and ``R = candidate_counts.sum()`` the number of rows.

    Args:
        user_ids: int64[E] raw user ids.
        device_ids: int64[E] raw device ids (:func:`model.features.spec.string_to_id` of the
        string).
        country_ids: int64[E] raw country ids (:func:`model.features.spec.string_to_id`).
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


def _describe(arr: object) -> str:
    if isinstance(arr, np.ndarray):
        return f"ndarray(dtype={arr.dtype}, shape={arr.shape})"
    return type(arr).__name__
