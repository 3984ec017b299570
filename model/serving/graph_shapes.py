"""Static batch shapes for the compile modes that record CUDA graphs.

``torch.compile`` in ``reduce-overhead`` or ``max-autotune`` mode replays CUDA graphs, and a
graph holds fixed tensor shapes: every new shape records another graph (seconds, and memory
that stays in the graph pool). A batch's shapes are its row count and, per KJT key, its value
count (``length_per_key``), both of which vary from batch to batch. So with these modes every
batch is padded to one of a few :class:`GraphShape` s before its forward:

- rows to a bucket of :func:`row_buckets` (``max_batch_rows`` halved, at most ``count`` of
  them), plus one *sink* row;
- each key's values to ``bucket * max_ids_per_row(key)``, the most that ``bucket`` real rows
  can carry (one id for single-valued keys, ``spec.recent_items_cap`` for recent items).

Padding rows have zero dense features and empty bags, except the sink row (the last), whose
bags hold the padding ids (row 0 of each table) that fill every key to its static count. The
scores of all padding rows are dropped. One graph per bucket is recorded, at warm-up.

CUDA-graph trees are kept per thread: the warm-up that records the graphs must run on the
thread that runs the forwards (the scoring thread), or every graph is recorded again there
while batches wait. Recording and replaying real graphs needs a GPU; the tests here check the
shapes and that padding leaves the real rows' scores unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model.features.layout import InputLayout
from model.features.model_input import ModelInput, as_layout, sparse_features
from model.features.spec import FeatureSpec
from model.options import CompileMode

__all__ = [
    "GRAPH_MODES",
    "GraphShape",
    "graph_shapes",
    "max_ids_per_row",
    "pad_to_shape",
    "records_cuda_graphs",
    "row_buckets",
    "shape_for",
]

#: Compile modes whose compiled forward replays CUDA graphs.
GRAPH_MODES = frozenset({CompileMode.REDUCE_OVERHEAD, CompileMode.MAX_AUTOTUNE})


def records_cuda_graphs(compiled: bool, mode: CompileMode | str, device: torch.device) -> bool:
    """Whether the served model replays CUDA graphs (so its batches need static shapes).

    Args:
        compiled: ``model.compile``.
        mode: ``model.compile_mode``.
        device: the model's device (graphs exist only on CUDA).

    Returns:
        ``True`` for a compiled model in a :data:`GRAPH_MODES` mode on a CUDA device.

    Example::

        records_cuda_graphs(True, "reduce-overhead", torch.device("cuda:0"))  # True
    """
    return compiled and CompileMode(mode) in GRAPH_MODES and device.type == "cuda"


def row_buckets(max_batch_rows: int, count: int = 8) -> tuple[int, ...]:
    """Row counts that batches are padded up to: ``max_batch_rows``, then halved (rounded up)
    until ``count`` buckets or 1 row, smallest first.

    ``count`` bounds the graphs recorded (and the warm-up time): a batch pads to at most twice
    its rows, except below the smallest bucket.

    Args:
        max_batch_rows: the largest batch (``batching.max_batch_rows``).
        count: how many buckets at most (>= 1).

    Returns:
        Increasing bucket sizes, the last one ``max_batch_rows``.

    Raises:
        ValueError: if ``max_batch_rows`` or ``count`` is below 1.

    Example::

        row_buckets(4096, count=4)  # (512, 1024, 2048, 4096)
        row_buckets(3000, count=3)  # (750, 1500, 3000)
    """
    if max_batch_rows < 1 or count < 1:
        raise ValueError(f"need max_batch_rows >= 1 and count >= 1, got {max_batch_rows}, {count}")
    buckets = [max_batch_rows]
    while len(buckets) < count and buckets[-1] > 1:
        buckets.append(math.ceil(buckets[-1] / 2))
    return tuple(sorted(set(buckets)))


def max_ids_per_row(model: FeatureSpec | InputLayout) -> tuple[int, ...]:
    """The most ids one row carries per KJT key, in key order: one for the single-valued keys,
    the cap for multi-valued ones (the built-in ``recent_items``: ``spec.recent_items_cap``).

    Args:
        model: the model's input layout (or the built-in model's feature spec).

    Returns:
        One count per key.
    """
    return as_layout(model).ids_per_key


@dataclass(frozen=True)
class GraphShape:
    """The static shapes of one CUDA graph: up to ``rows`` real rows.

    Attributes:
        rows: the bucket: real rows it holds at most.
        values_per_key: the KJT's value count of every key.
    """

    rows: int
    values_per_key: tuple[int, ...]

    @property
    def padded_rows(self) -> int:
        """Rows of the padded batch: the bucket plus the sink row."""
        return self.rows + 1


def graph_shapes(
    model: FeatureSpec | InputLayout, max_batch_rows: int, count: int = 8
) -> tuple[GraphShape, ...]:
    """One :class:`GraphShape` per bucket of :func:`row_buckets`.

    Args:
        model: the model's input layout (or the built-in model's feature spec).
        max_batch_rows: the largest batch.
        count: how many buckets at most.

    Returns:
        The shapes, smallest first.

    Example::

        shapes = graph_shapes(spec, settings.batching.max_batch_rows)
    """
    per_row = max_ids_per_row(model)
    return tuple(
        GraphShape(rows, tuple(rows * n for n in per_row))
        for rows in row_buckets(max_batch_rows, count)
    )


def shape_for(rows: int, shapes: Sequence[GraphShape]) -> GraphShape:
    """The smallest shape that holds ``rows`` real rows.

    Args:
        rows: the batch's rows.
        shapes: from :func:`graph_shapes`, smallest first.

    Returns:
        The shape to pad the batch to.

    Raises:
        ValueError: if ``rows`` exceeds the largest shape.
    """
    for shape in shapes:
        if rows <= shape.rows:
            return shape
    largest = shapes[-1].rows if shapes else 0
    raise ValueError(f"a batch of {rows} rows exceeds the largest graph shape ({largest} rows)")


def pad_to_shape(inp: ModelInput, shape: GraphShape) -> ModelInput:
    """``inp`` padded to exactly ``shape`` (on ``inp``'s device; no host synchronisation
    when the KJT carries its per-key value counts on the host, as every input built by
    :func:`model.features.build.build_model_input` does).

    Args:
        inp: the batch, ``inp.num_rows <= shape.rows``.
        shape: its graph shape (:func:`shape_for`).

    Returns:
        ``shape.padded_rows`` rows with ``shape.values_per_key`` values per key; its first
        ``inp.num_rows`` rows score exactly as ``inp``'s, the rest are to be dropped.

    Raises:
        ValueError: if ``inp`` has more rows, keys or values than ``shape`` holds.

    Example::

        padded = pad_to_shape(inp, shape_for(inp.num_rows, shapes))
        probs = score_probabilities(compiled, padded)[: inp.num_rows]
    """
    rows, keys, sparse = inp.num_rows, inp.sparse.keys(), inp.sparse
    if rows > shape.rows or len(keys) != len(shape.values_per_key):
        raise ValueError(
            f"a batch of {rows} rows and {len(keys)} keys does not fit the graph shape of "
            f"{shape.rows} rows and {len(shape.values_per_key)} keys"
        )
    lengths = sparse.lengths().view(len(keys), rows)
    per_key = sparse.length_per_key_or_none()
    if per_key is None:  # a device read; inputs of model.features.build always carry them
        per_key = [int(n) for n in lengths.sum(dim=1).tolist()]
    fill = [cap - have for cap, have in zip(shape.values_per_key, per_key, strict=True)]
    if min(fill) < 0:
        raise ValueError(
            f"values per key {list(per_key)} exceed the graph shape's {list(shape.values_per_key)}"
        )
    pad_rows = shape.padded_rows - rows
    pad_lengths = lengths.new_zeros((len(keys), pad_rows))
    for key, n in enumerate(fill):  # scalar fills: nothing is copied from the host
        if n:
            pad_lengths[key, -1] = n
    values = sparse.values()
    zeros = values.new_zeros(max(fill))
    parts = [
        piece
        for key_values, n in zip(values.split(list(per_key)), fill, strict=True)
        for piece in (key_values, zeros[:n])
    ]
    weights = sparse.weights_or_none()
    if weights is not None:  # the padding ids weigh 0
        no_weight = weights.new_zeros(max(fill))
        weights = torch.cat(
            [
                piece
                for key_weights, n in zip(weights.split(list(per_key)), fill, strict=True)
                for piece in (key_weights, no_weight[:n])
            ]
        )
    dense = torch.cat([inp.dense, inp.dense.new_zeros((pad_rows, inp.dense.shape[1]))])
    padded = sparse_features(
        keys,
        torch.cat(parts),
        torch.cat([lengths, pad_lengths], dim=1).reshape(-1),
        shape.padded_rows,
        list(shape.values_per_key),
        weights,
    )
    return ModelInput(dense=dense, sparse=padded)
