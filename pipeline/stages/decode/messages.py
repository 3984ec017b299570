"""What both decoders do with consumed messages around their own ``decode_values``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from pipeline.types import DecodedMessages, EventColumns, PolledBatch, RejectedMessage

__all__ = ["ValueDecoder", "decoded_messages", "value_sizes"]

ValueDecoder = Callable[
    [list[bytes | None], npt.NDArray[np.int64] | None],
    tuple[EventColumns, npt.NDArray[np.int64], list[tuple[int, RejectedMessage]]],
]
"""A decoder's ``decode_values``: the accepted events, each one's value index, the rejections."""


def decoded_messages(messages: PolledBatch, decode_values: ValueDecoder) -> DecodedMessages:
    """``messages`` (in consumption order) with their values decoded and validated by
    ``decode_values``."""
    events, accepted, rejections = decode_values(messages.values, messages.value_lengths)
    return DecodedMessages(messages, events, accepted, rejections)


def value_sizes(
    values: list[bytes | None], lengths: npt.NDArray[np.int64] | None
) -> npt.NDArray[np.int64]:
    """Bytes of each value, 0 for a null one (``lengths``: as the Kafka edge measured them,
    -1 for null; ``None``: measured here)."""
    if lengths is not None:
        return np.maximum(lengths, 0)
    return np.fromiter((len(v) if v else 0 for v in values), np.int64, len(values))
