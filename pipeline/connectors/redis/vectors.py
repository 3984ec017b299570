"""Reading one vector field of many Redis records at once: every catalogue item's vector, when a
configured model's retrieval index holds a field of the item records
(``retrieval.items = { source = "item", field = ... }``).

The records are read in pages, one round trip each, with the layout's own requests and parsers
(:mod:`pipeline.connectors.redis.layout`), so a value is absent exactly where the enricher would
find it absent.

Example::

    vectors, present = read_vectors(client, layout, layout.field("embedding"), ids, 1 << 20)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt
import redis

from model.features.mapping import RecordField, RecordLayout
from pipeline.connectors.redis.layout import (
    hmget_commands,
    keyed_commands,
    mget_head,
    parse_hashes,
    parse_packed,
)
from pipeline.settings.features import RecordFormat

__all__ = ["read_vectors"]


def read_vectors(
    client: redis.Redis,
    layout: RecordLayout,
    field: RecordField,
    ids: npt.NDArray[np.int64],
    max_bytes: int,
    page: int = 10_000,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """One vector field of the records of ``ids`` (e.g. every catalogue item's, for a retrieval
    index), read in pages of ``page`` ids, one round trip each.

    A record (or its field) that is missing, malformed, over ``max_bytes`` or not finite is
    absent, as the enricher reads it; a Redis error raises.

    Args:
        client: the feature store.
        layout: the side's layout (``[features.item]``).
        field: one of its ``vector`` fields.
        ids: int64[N] the records' ids.
        max_bytes: ``redis.max_value_bytes``.
        page: ids per round trip.

    Returns:
        ``(float32[N, width] the vectors (zeros where absent), bool[N] present)``.

    Example::

        vectors, present = read_vectors(client, layout, layout.field("embedding"), ids, 1 << 20)
    """
    hashed = layout.format is RecordFormat.HASH
    read = RecordLayout(layout.key, layout.format, (dataclasses.replace(field, column=0),))
    chosen = read if hashed else layout
    index = 0 if hashed else layout.fields.index(field)
    column = 0 if hashed else field.column
    vectors = np.zeros((len(ids), field.width), dtype=np.float32)
    present = np.zeros(len(ids), dtype=bool)
    connection = client.connection_pool.make_connection()
    try:
        for start in range(0, len(ids), page):
            chunk = np.ascontiguousarray(ids[start : start + page], dtype=np.int64)
            if hashed:
                connection.send_packed_command([hmget_commands(read, chunk)])
                replies = [_reply(connection) for _ in range(len(chunk))]
                rows = parse_hashes(replies, read, "item", max_bytes)
            else:
                connection.send_packed_command([mget_head(len(chunk)) + keyed_commands(
                    layout.key, chunk
                )])  # fmt: skip
                rows = parse_packed(connection.read_response(), chosen, "item", max_bytes)
            stop = start + len(chunk)
            vectors[start:stop] = rows.floats[:, column : column + field.width]
            present[start:stop] = rows.present[:, index]
    finally:
        connection.disconnect()
    return vectors, present


def _reply(connection: Any) -> Any:
    """The next reply; an error reply (a key of another type) is that record's: ``None``."""
    try:
        return connection.read_response()
    except redis.ResponseError:
        return None
