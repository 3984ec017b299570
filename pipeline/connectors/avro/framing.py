"""The Confluent wire format's header, read in one place for one message or a whole batch.

A framed value is the magic byte ``0``, a 4-byte big-endian schema id, then the Avro body.

Example::

    header(7) + body         # a framed value
    schema_id(value)         # 7, or None when the value is not framed
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt

MAGIC = 0
_HEADER = struct.Struct(">bI")
HEADER_BYTES = _HEADER.size


def header(schema_id: int) -> bytes:
    """The header that frames a body written with schema ``schema_id``."""
    return _HEADER.pack(MAGIC, schema_id)


def schema_id(value: bytes) -> int | None:
    """The schema id of a framed value; ``None`` when ``value`` is not framed."""
    if len(value) < HEADER_BYTES or value[0] != MAGIC:
        return None
    return int(_HEADER.unpack_from(value)[1])


def schema_ids(
    buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
    """:func:`schema_id` of many values laid end to end in ``buf`` (vectorised).

    Args:
        buf: the values back to back.
        starts / lengths: int64[M] each value's bounds.

    Returns:
        ``(framed, ids)``: bool[M] whether each value is framed, int64[M] its schema id (0
        where not framed).
    """
    framed = lengths >= HEADER_BYTES
    at = starts[framed]
    framed[framed] = buf[at] == MAGIC
    at = starts[framed]
    ids = np.zeros(len(starts), dtype=np.int64)
    for i in range(1, HEADER_BYTES):
        ids[framed] = ids[framed] * 256 + buf[at + i]
    return framed, ids
