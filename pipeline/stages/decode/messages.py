"""What both decoders do with consumed messages around their own ``decode_values``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from confluent_kafka import Message

from pipeline.types import DecodedMessages, EventColumns, RejectedMessage

__all__ = ["ValueDecoder", "decoded_messages"]

ValueDecoder = Callable[
    [list[bytes | None]],
    tuple[EventColumns, npt.NDArray[np.int64], list[tuple[int, RejectedMessage]]],
]
"""A decoder's ``decode_values``: the accepted events, each one's value index, the rejections."""


def decoded_messages(
    topic: str, messages: list[Message], decode_values: ValueDecoder
) -> DecodedMessages:
    """``messages`` (consumed from ``topic``, in consumption order) with their partitions and
    offsets, their values decoded and validated by ``decode_values``."""
    n = len(messages)
    partitions = np.fromiter((m.partition() for m in messages), np.int64, n)
    offsets = np.fromiter((m.offset() for m in messages), np.int64, n)
    events, accepted, rejections = decode_values([m.value() for m in messages])
    return DecodedMessages(topic, messages, partitions, offsets, events, accepted, rejections)
