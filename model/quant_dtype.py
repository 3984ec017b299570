"""Storage types of the embedding tables (no torch import: configuration loading uses it)."""

from __future__ import annotations

import enum

__all__ = ["QuantDtype"]


class QuantDtype(enum.StrEnum):
    """Storage type of the embedding tables (:func:`model.serving.quantize.quantize_ranker`).

    Example::

        QuantDtype("int8") is QuantDtype.INT8
    """

    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    INT4 = "int4"
