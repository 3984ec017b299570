"""Quantized embedding tables for single-process inference.

:func:`quantize_ranker` swaps the ranker's ``EmbeddingBagCollection`` for TorchRec's quantized
one (``torchrec.quant.EmbeddingBagCollection``, FBGEMM ``IntNBitTableBatchedEmbeddingBags``) via
``torchrec.inference.modules.quantize_inference_model``; the dense MLPs stay fp32. Rows are
stored row-wise quantized: int8 rows hold ``dim`` bytes plus an fp16 scale and bias, padded to
16 bytes (dim 64: 80 bytes instead of 256, 0.31x); fp16 rows hold ``2 * dim`` bytes (0.5x).

The quantized model takes the same ``(dense, KeyedJaggedTensor)`` input and runs on the CPU,
under ``torch.no_grad()`` and ``torch.inference_mode()`` alike. It is single-process:
``torchrec.inference.modules.shard_quant_model`` shards across devices of one process, not
across ranks. Use the quantization mapping (``quantize_inference_model``), not
``from_float`` on single modules (``QuantManagedCollisionEmbeddingBagCollection.from_float``
alone yields all-zero embeddings).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn
from torchrec.inference.modules import DEFAULT_QUANT_MAPPING, quantize_inference_model

from model.features.model_input import ModelInput
from model.options import QuantDtype
from model.ranker import Ranker
from model.serving.memory import embedding_bytes

__all__ = [
    "QuantDtype",
    "QuantReport",
    "compare_quantized",
    "quantize_ranker",
    "quantize_with_report",
]


# The dtype handed to ``quantize_inference_model`` per storage type.
_TORCH_DTYPES: dict[QuantDtype, torch.dtype] = {
    QuantDtype.FP32: torch.float32,
    QuantDtype.FP16: torch.float16,
    QuantDtype.INT8: torch.int8,
    QuantDtype.INT4: torch.quint4x2,
}


M = TypeVar("M", bound=nn.Module)


def quantize_ranker(ranker: M, dtype: QuantDtype | str) -> M:
    """A copy of ``ranker`` (the built-in one, or any module whose tables are
    ``EmbeddingBagCollection`` s) whose embedding tables are stored as ``dtype``.

    Args:
        ranker: the fp32 ranker (tables materialised, on the CPU or one CUDA device); it is not
            modified.
        dtype: ``fp32`` (a plain eval-mode copy), ``fp16``, ``int8`` or ``int4`` (lossy:
            ~1e-3 score change).

    Returns:
        A :class:`~model.ranker.Ranker` in eval mode whose ``model.sparse_arch
        .embedding_bag_collection`` is a quantized EBC; ``score()`` and ``forward()`` work as
        before (``Ranker.embedding_bag_collection`` does not: it expects the float module).

    Raises:
        ValueError: on an unknown dtype or a ranker whose tables are on the meta device.

    Example::

        q = quantize_ranker(ranker, "int8")
        probs = q.score(inp)
        print(embedding_bytes(q) / embedding_bytes(ranker))  # ~0.31 at dim 64
    """
    qdtype = QuantDtype(dtype)
    if any(p.is_meta for p in ranker.parameters()):
        raise ValueError("cannot quantize a ranker whose weights are on the meta device")
    model = copy.deepcopy(ranker)
    model.eval()
    if qdtype is QuantDtype.FP32:
        return model
    quantize_inference_model(
        model,
        quantization_mapping=DEFAULT_QUANT_MAPPING,
        quantization_dtype=_TORCH_DTYPES[qdtype],
        output_dtype=torch.float,
    )
    model.eval()
    return model


@dataclass(frozen=True)
class QuantReport:
    """Size and accuracy of a quantized ranker against its fp32 original.

    Args:
        dtype: the table storage type.
        fp32_bytes: table bytes of the fp32 ranker.
        quant_bytes: table bytes of the quantized ranker.
        ratio: ``quant_bytes / fp32_bytes``.
        max_abs_score_diff: largest absolute difference of click probabilities on the
            compared batch.
        num_rows: rows in the compared batch.

    Example::

        q, report = quantize_with_report(ranker, "int8", inp)
        assert report.ratio < 0.35 and report.max_abs_score_diff < 1e-3
    """

    dtype: QuantDtype
    fp32_bytes: int
    quant_bytes: int
    ratio: float
    max_abs_score_diff: float
    num_rows: int

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "dtype": self.dtype.value,
            "fp32_bytes": self.fp32_bytes,
            "quant_bytes": self.quant_bytes,
            "ratio": self.ratio,
            "max_abs_score_diff": self.max_abs_score_diff,
            "num_rows": self.num_rows,
        }


def compare_quantized(
    ranker: Ranker, quantized: Ranker, inp: ModelInput, dtype: QuantDtype | str
) -> QuantReport:
    """Compare table sizes and scores of ``quantized`` with the fp32 ``ranker``.

    Args:
        ranker: the fp32 ranker (in eval mode, for a fair comparison).
        quantized: e.g. :func:`quantize_ranker`'s result.
        inp: the batch to score with both (on their device).
        dtype: the quantized ranker's table type (recorded in the report).

    Returns:
        The :class:`QuantReport`.

    Example::

        print(compare_quantized(ranker, quantize_ranker(ranker, "fp16"), inp, "fp16").as_dict())
    """
    fp32_bytes = embedding_bytes(ranker)
    quant_bytes = embedding_bytes(quantized)
    ref = ranker.score(inp)
    got = quantized.score(inp)
    diff = float((ref - got).abs().max()) if ref.numel() else 0.0
    return QuantReport(
        dtype=QuantDtype(dtype),
        fp32_bytes=fp32_bytes,
        quant_bytes=quant_bytes,
        ratio=quant_bytes / fp32_bytes if fp32_bytes else float("nan"),
        max_abs_score_diff=diff,
        num_rows=inp.num_rows,
    )


def quantize_with_report(
    ranker: Ranker, dtype: QuantDtype | str, inp: ModelInput
) -> tuple[Ranker, QuantReport]:
    """:func:`quantize_ranker` plus :func:`compare_quantized` on ``inp``.

    Args:
        ranker: the fp32 ranker (not modified; scored in eval mode).
        dtype: the table type.
        inp: the batch to compare scores on.

    Returns:
        ``(quantized ranker, report)``.

    Example::

        q, report = quantize_with_report(ranker, "int8", inp)
        log.info("int8 tables: %.2fx, max score change %.1e", report.ratio,
                 report.max_abs_score_diff)
    """
    quantized = quantize_ranker(ranker, dtype)
    was_training = ranker.training
    ranker.eval()
    try:
        report = compare_quantized(ranker, quantized, inp, dtype)
    finally:
        ranker.train(was_training)
    return quantized, report
