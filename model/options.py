"""Serving options as string enums: precision, compile mode, table storage type. Importable
without torch (the config imports them)."""

from __future__ import annotations

import enum

__all__ = ["CompileMode", "Precision", "QuantDtype"]


class Precision(enum.StrEnum):
    """``model.precision``."""

    FP32 = "fp32"
    """Full float32 everywhere (the reference)."""
    TF32 = "tf32"
    """float32 tensors, TensorFloat-32 matrix multiplies on GPUs that have them."""
    BF16 = "bf16"
    """bfloat16 autocast: matmuls and MLPs in bf16, embeddings and the output in float32."""


class CompileMode(enum.StrEnum):
    """``torch.compile`` modes (``model.compile_mode``).

    On an H200, ``max-autotune-no-cudagraphs`` gained 4% in fp32 and 28% in bf16 at 146k rows
    per batch, after 88-115 s of compiling; ``default`` gained nothing at 98k rows.
    """

    DEFAULT = "default"
    REDUCE_OVERHEAD = "reduce-overhead"
    MAX_AUTOTUNE = "max-autotune"
    MAX_AUTOTUNE_NO_CUDAGRAPHS = "max-autotune-no-cudagraphs"


class QuantDtype(enum.StrEnum):
    """Storage type of the embedding tables (:func:`model.serving.quantize.quantize_ranker`).

    Example::

        QuantDtype("int8") is QuantDtype.INT8
    """

    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    INT4 = "int4"
