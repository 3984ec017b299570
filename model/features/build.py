"""Columnar features for a micro-batch and their conversion into the ranker's input.

The pipeline (and :mod:`model.synthetic`) collect each micro-batch as flat numpy columns,
:class:`~model.features.columns.FeatureColumns` (numpy only, re-exported here);
:func:`build_model_input` turns them into a dense tensor plus a TorchRec
``KeyedJaggedTensor`` in one compiled (numba) pass (no Python loop over rows or events).

Layout of a batch with ``E`` events and ``R = candidate_counts.sum()`` rows: rows are
event-major, i.e. the candidates of event 0, then those of event 1, and so on.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from model.features.columns import FeatureColumns, Float32Array, Int64Array
from model.features.model_input import ModelInput, sparse_features
from model.features.spec import _GOLDEN, _MIX1, _MIX2, SPARSE_FEATURE_ORDER, FeatureSpec
from model.kernels import kernel

__all__ = ["FeatureColumns", "build_model_input"]


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


@kernel
def _hash(raw: int, salt: np.uint64, num_rows: np.uint64) -> int:
    """:func:`model.features.spec.hash_to_rows` of one id (its splitmix64 finaliser and constants,
    in
    uint64 arithmetic)."""
    z = np.uint64(raw) + salt
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return int(np.int64(z % num_rows))


@kernel
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
