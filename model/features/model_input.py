"""The ranker's input for one batch: a dense tensor and a KeyedJaggedTensor, movable anywhere.

Every KJT the project builds goes through :func:`sparse_features`, which records the per-key
value counts on the host (``length_per_key``/``offset_per_key``, plain Python ints). A forward
then splits the KJT by key without reading its lengths back from the device (no hidden
synchronisation on a GPU), and :meth:`ModelInput.to` can rebuild the KJT on another device
from its values and lengths alone: TorchRec's own ``KeyedJaggedTensor.to`` carries the per-key
``to_dict()`` cache across, which after a CPU forward still holds CPU tensors and breaks the
next forward on CUDA ("indices is on cpu").
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from model.features.layout import InputLayout
from model.features.spec import FeatureSpec

__all__ = [
    "ModelInput",
    "as_layout",
    "pad_model_input",
    "padding_input",
    "sparse_features",
    "warm_up_input",
]


def sparse_features(
    keys: Sequence[str],
    values: torch.Tensor,
    lengths: torch.Tensor,
    stride: int,
    length_per_key: Sequence[int] | None = None,
    weights: torch.Tensor | None = None,
) -> KeyedJaggedTensor:
    """A fresh KJT with no cached device state.

    Args:
        keys: feature names, in layout order.
        values: all ids, key-major.
        lengths: bag length of every (key, row), key-major (``len(keys) * stride``).
        stride: rows per key.
        length_per_key: values per key when known on the host (no device read needed later).
        weights: float32, one per value (a weighted ``EmbeddingBagCollection`` reads them);
            ``None``: no weights.

    Returns:
        The KJT.

    Example::

        kjt = sparse_features(["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 2]), 1, [1, 2])
    """
    per_key = list(length_per_key) if length_per_key is not None else None
    return KeyedJaggedTensor(
        keys=list(keys),
        values=values,
        weights=weights,
        lengths=lengths,
        stride=stride,
        length_per_key=per_key,
        offset_per_key=[0, *itertools.accumulate(per_key)] if per_key is not None else None,
    )


@dataclass
class ModelInput:
    """The ranker's input for ``R`` rows.

    Args:
        dense: float32[R, spec.dense_dim], the user's dense vector then the item's.
        sparse: KJT with keys ``spec.feature_names`` in order and stride ``R``; values are hashed
            table rows (int64), lengths are int64.

    Example::

        inp = build_model_input(cols, spec).to("cuda")
        logits = ranker(inp.dense, inp.sparse)
    """

    dense: torch.Tensor
    sparse: KeyedJaggedTensor

    @property
    def num_rows(self) -> int:
        """``R``, the number of rows."""
        return int(self.dense.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ModelInput:
        """Copy to ``device``, at any time (before or after a forward).

        The KJT is rebuilt from its values and lengths (see the module docstring): nothing
        reachable from the result stays on the old device.

        Args:
            device: target device.
            non_blocking: asynchronous copies (from pinned memory, see :meth:`pin_memory`).

        Returns:
            A new :class:`ModelInput` on ``device``.
        """
        dev = torch.device(device)
        sparse = self.sparse
        weights = sparse.weights_or_none()
        return ModelInput(
            dense=self.dense.to(dev, non_blocking=non_blocking),
            sparse=sparse_features(
                sparse.keys(),
                sparse.values().to(dev, non_blocking=non_blocking),
                sparse.lengths().to(dev, non_blocking=non_blocking),
                sparse.stride(),
                sparse.length_per_key_or_none(),
                None if weights is None else weights.to(dev, non_blocking=non_blocking),
            ),
        )

    def pin_memory(self) -> ModelInput:
        """A copy in page-locked host memory (needs CUDA), for asynchronous copies to a GPU."""
        sparse = self.sparse
        weights = sparse.weights_or_none()
        return ModelInput(
            dense=self.dense.pin_memory(),
            sparse=sparse_features(
                sparse.keys(),
                sparse.values().pin_memory(),
                sparse.lengths().pin_memory(),
                sparse.stride(),
                sparse.length_per_key_or_none(),
                None if weights is None else weights.pin_memory(),
            ),
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor reachable from this input, the KJT's per-key views included."""
        sparse = self.sparse
        out = [self.dense, sparse.values(), sparse.lengths(), sparse.offsets()]
        weights = sparse.weights_or_none()
        out += [] if weights is None else [weights]
        for jagged in sparse.to_dict().values():
            out += [jagged.values(), jagged.lengths(), jagged.offsets()]
            jagged_weights = jagged.weights_or_none()
            out += [] if jagged_weights is None else [jagged_weights]
        return out


def pad_model_input(inp: ModelInput, num_rows: int) -> ModelInput:
    """Append padding rows so the batch has exactly ``num_rows`` rows.

    Padding rows have an all-zero dense vector and an empty (length-0) bag for every key, so
    they look up no table row (SUM pooling yields zero embeddings) and add no KJT values.
    Their scores are meaningless: drop the last ``num_rows - inp.num_rows`` outputs.

    Args:
        inp: the batch (any device).
        num_rows: target row count, ``>= inp.num_rows``.

    Returns:
        ``inp`` itself if it already has ``num_rows`` rows, else a padded copy.

    Raises:
        ValueError: if ``num_rows < inp.num_rows``.

    Example::

        padded = pad_model_input(inp, 1024)
        scores = ranker.score(padded)[: inp.num_rows]
    """
    have = inp.num_rows
    if num_rows < have:
        raise ValueError(f"cannot pad a batch of {have} rows down to {num_rows}")
    if num_rows == have:
        return inp
    pad = num_rows - have
    dense = torch.cat([inp.dense, inp.dense.new_zeros((pad, inp.dense.shape[1]))], dim=0)
    keys = inp.sparse.keys()
    lengths = inp.sparse.lengths().view(len(keys), have)
    lengths = torch.cat([lengths, lengths.new_zeros((len(keys), pad))], dim=1).reshape(-1)
    sparse = sparse_features(
        keys,
        inp.sparse.values(),
        lengths,
        num_rows,
        inp.sparse.length_per_key_or_none(),
        inp.sparse.weights_or_none(),  # padding rows add no values, so no weights
    )
    return ModelInput(dense=dense, sparse=sparse)


def as_layout(model: FeatureSpec | InputLayout) -> InputLayout:
    """The input layout of the built-in spec, or ``model`` itself."""
    return model.input_layout() if isinstance(model, FeatureSpec) else model


def padding_input(
    model: FeatureSpec | InputLayout, rows: int, device: torch.device | str
) -> ModelInput:
    """``rows`` padding rows (zero dense, empty bags): what a rank with no events of its own
    feeds to a collective forward.

    Args:
        model: the model's input layout (or the built-in model's feature spec).
        rows: how many rows.
        device: where to build it.

    Returns:
        The input.
    """
    layout = as_layout(model)
    keys = layout.keys
    sparse = sparse_features(
        keys,
        torch.empty(0, dtype=torch.int64, device=device),
        torch.zeros(len(keys) * rows, dtype=torch.int64, device=device),
        rows,
        [0] * len(keys),
        torch.empty(0, device=device) if layout.weighted else None,
    )
    return ModelInput(dense=torch.zeros((rows, layout.dense_dim), device=device), sparse=sparse)


def warm_up_input(model: FeatureSpec | InputLayout, rows: int) -> ModelInput:
    """``rows`` rows shaped like real traffic (each key's most ids per row; all ids 0):
    compiles and autotunes the kernels a real batch of that size will use.

    Args:
        model: the model's input layout (or the built-in model's feature spec).
        rows: how many rows.

    Returns:
        The input, on the CPU.
    """
    layout = as_layout(model)
    per_row = list(layout.ids_per_key)
    lengths = torch.tensor(per_row, dtype=torch.int64).repeat_interleave(rows)
    total = [rows * n for n in per_row]
    sparse = sparse_features(
        layout.keys,
        torch.zeros(sum(total), dtype=torch.int64),
        lengths,
        rows,
        total,
        torch.ones(sum(total)) if layout.weighted else None,
    )
    return ModelInput(dense=torch.zeros((rows, layout.dense_dim)), sparse=sparse)
