"""A configured Redis layout (``[features.user]`` / ``[features.item]``): the requests that read a
batch's records in one round trip, and their values parsed into columns.

Keys come from a template (``viewer:{id}``: the id in decimal). Values are either

- ``packed``: the built-in binary layout (:mod:`pipeline.connectors.redis.feature_store`),
  read with one ``MGET`` for all keys;
- ``hash``: a Redis hash per id with one field per name, read with one ``HMGET`` per id, all
  written into one buffer and sent at once (one round trip, replies read back in order):
  ``vector:N`` fields are ``float32[N]`` little-endian bytes, ``id`` fields decimal integers,
  ``id_list:N`` fields ``int64`` little-endian bytes (the first ``N`` kept), ``weights:<list>``
  fields ``float32`` little-endian bytes, one per id of that list (the first ``N`` kept).

A record parses into one row of :class:`RecordRows` (the layout the enricher's cache keeps): its
ids then its lists' lengths as ints, its vectors and weights as floats
(weights padded to their list's cap), its lists' ids side by side (each list padded to its cap),
and which of its fields are present. Each field stands alone (but an id list with a weights
field is present only with its weights, one per id: else neither is): a missing key (or no
reply) leaves every field absent; a hash field that is missing, malformed,
over ``redis.max_value_bytes`` or (a vector) not finite is absent while the record's other
fields serve; a packed value that is not of the layout's shape (or over the bound) is wholly
absent, and its vector alone when a value is not finite. An absent field holds zeros (an empty
list); the features stage gives the model what its key's ``missing`` policy says.

Example::

    request = keyed_commands(layout.key, ids, hmget_tail(layout))
    rows = parse_hashes(replies, layout)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import redis

from model.features.mapping import RecordKind, RecordLayout
from model.kernels import kernel
from pipeline.connectors.redis.feature_store import put_bulk_key
from pipeline.settings.features import RecordFormat

__all__ = [
    "RecordRows",
    "hmget_commands",
    "hmget_tail",
    "keyed_commands",
    "mget_head",
    "parse_hashes",
    "parse_packed",
    "write_hashes",
]

log = logging.getLogger(__name__)

_MAX_KEY_DIGITS = 20
"""Characters of the longest decimal int64 (its sign included)."""


def _bulk(text: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(text), text)


def mget_head(keys: int) -> bytes:
    """The start of an ``MGET`` of ``keys`` keys (the keys follow as bulk strings)."""
    return b"*%d\r\n$4\r\nMGET\r\n" % (keys + 1)


def hmget_tail(layout: RecordLayout) -> bytes:
    """What follows the key of each ``HMGET`` of ``layout``: its field names."""
    return b"".join(_bulk(f.name.encode()) for f in layout.fields)


def keyed_commands(
    template: str, ids: npt.NDArray[np.int64], per_id_head: bytes = b"", per_id_tail: bytes = b""
) -> bytes:
    """Bulk strings of every key of ``template``, each between ``per_id_head`` and
    ``per_id_tail`` (one compiled pass, no Python string per key).

    With ``per_id_head = b"*K\\r\\n$5\\r\\nHMGET\\r\\n"`` and the fields as the tail this writes
    one ``HMGET`` per id; with neither, the keys of an ``MGET`` (after :func:`mget_head`).

    Example::

        keyed_commands("u:{id}:f", np.array([7]))  # b"$7\\r\\nu:7:f\\r\\n"
    """
    prefix, _, suffix = template.partition("{id}")
    pre = np.frombuffer(prefix.encode(), dtype=np.uint8)
    post = np.frombuffer(suffix.encode(), dtype=np.uint8)
    head = np.frombuffer(per_id_head, dtype=np.uint8)
    tail = np.frombuffer(per_id_tail, dtype=np.uint8)
    key_max = len(pre) + len(post) + _MAX_KEY_DIGITS
    per_id = len(head) + len(tail) + key_max + len(str(key_max)) + 5
    out = np.empty(len(ids) * per_id, dtype=np.uint8)
    end = _put_keyed(pre, post, head, tail, np.ascontiguousarray(ids, dtype=np.int64), out)
    return out[:end].tobytes()


def hmget_commands(layout: RecordLayout, ids: npt.NDArray[np.int64]) -> bytes:
    """One ``HMGET key field...`` per id, back to back (pipelined: one round trip)."""
    head = b"*%d\r\n$5\r\nHMGET\r\n" % (len(layout.fields) + 2)
    return keyed_commands(layout.key, ids, head, hmget_tail(layout))


@kernel
def _put_keyed(
    prefix: npt.NDArray[np.uint8],
    suffix: npt.NDArray[np.uint8],
    head: npt.NDArray[np.uint8],
    tail: npt.NDArray[np.uint8],
    ids: npt.NDArray[np.int64],
    out: npt.NDArray[np.uint8],
) -> int:
    at = 0
    for v in ids:
        out[at : at + len(head)] = head
        at += len(head)
        at = put_bulk_key(prefix, v, suffix, out, at)
        out[at : at + len(tail)] = tail
        at += len(tail)
    return at


@dataclass
class RecordRows:
    """Parsed records of one layout, row ``i`` for id ``i``.

    Attributes:
        ints: int64[n, ids + lists] each id field, then each list's length.
        floats: float32[n, vector values and weights], each field at its column.
        side: int64[n, sum of list caps] each list's ids, padded to its cap.
        present: bool[n, fields] each field of the layout (in its order) present and well
            formed; an absent one holds zeros (an empty list).
    """

    ints: npt.NDArray[np.int64]
    floats: npt.NDArray[np.float32]
    side: npt.NDArray[np.int64]
    present: npt.NDArray[np.bool_]

    @classmethod
    def defaults(cls, n: int, layout: RecordLayout) -> RecordRows:
        """``n`` records with every field absent."""
        width = layout.count(RecordKind.ID) + layout.count(RecordKind.ID_LIST)
        return cls(
            np.zeros((n, width), dtype=np.int64),
            np.zeros((n, layout.count(RecordKind.VECTOR)), dtype=np.float32),
            np.zeros((n, sum(layout.list_caps)), dtype=np.int64),
            np.zeros((n, len(layout.fields)), dtype=bool),
        )

    @property
    def found(self) -> npt.NDArray[np.bool_]:
        """bool[n]: records with a field present (the enricher caches these, never the rest)."""
        return np.asarray(self.present.any(axis=1), dtype=bool)


def _put_field(
    rows: RecordRows, layout: RecordLayout, index: int, values: list[bytes | None]
) -> npt.NDArray[np.bool_]:
    """Parse field ``index`` of ``len(values)`` records into ``rows``; which are good."""
    field = layout.fields[index]
    n = len(values)
    lengths = np.fromiter((-1 if v is None else len(v) for v in values), np.int64, n)
    if field.kind is RecordKind.VECTOR:
        good = lengths == 4 * field.width
        joined = b"".join(v for v, g in zip(values, good, strict=True) if g and v is not None)
        vectors = np.frombuffer(joined, dtype="<f4").reshape(-1, field.width)
        finite = np.isfinite(vectors).all(axis=1)
        rows.floats[np.flatnonzero(good)[finite], field.column : field.column + field.width] = (
            vectors[finite]
        )
        good[np.flatnonzero(good)[~finite]] = False
        return good
    if field.kind is RecordKind.WEIGHTS:
        return _put_weights(rows, layout, index, values, lengths)
    if field.kind is RecordKind.ID:
        good = lengths > 0
        for i in np.flatnonzero(good).tolist():
            try:
                rows.ints[i, field.column] = int(values[i])  # type: ignore[arg-type]
            except (ValueError, OverflowError):
                good[i] = False
        return good
    good = (lengths >= 0) & (lengths % 8 == 0)
    n_ids = layout.count(RecordKind.ID)
    offset = sum(layout.list_caps[: field.column])
    for i in np.flatnonzero(good).tolist():
        ids = np.frombuffer(values[i], dtype="<i8")[: field.width]  # type: ignore[arg-type]
        rows.ints[i, n_ids + field.column] = len(ids)
        rows.side[i, offset : offset + len(ids)] = ids
    return good


def _put_weights(
    rows: RecordRows,
    layout: RecordLayout,
    index: int,
    values: list[bytes | None],
    lengths: npt.NDArray[np.int64],
) -> npt.NDArray[np.bool_]:
    """Weights field ``index``: float32 values (the first ``width``), all finite, or absent."""
    field = layout.fields[index]
    good = (lengths >= 0) & (lengths % 4 == 0)
    for i in np.flatnonzero(good).tolist():
        weights = np.frombuffer(values[i], dtype="<f4")[: field.width]  # type: ignore[arg-type]
        if not np.isfinite(weights).all():
            good[i] = False
            continue
        rows.floats[i, field.column : field.column + len(weights)] = weights
    return good


def parse_hashes(
    replies: Sequence[Sequence[bytes | None] | None],
    layout: RecordLayout,
    side: str,
    max_bytes: int,
) -> RecordRows:
    """The records of ``HMGET`` replies (one list of field values per id; ``None``: no reply,
    an outage); a field value over ``max_bytes`` is absent, never copied."""
    n = len(replies)
    rows = RecordRows.defaults(n, layout)
    malformed = 0
    sizes: dict[int, npt.NDArray[np.int64]] = {}
    for index in range(len(layout.fields)):
        values = _bounded([None if r is None else r[index] for r in replies], max_bytes, side)
        rows.present[:, index] = _put_field(rows, layout, index, values)
        malformed += n - values.count(None) - int(rows.present[:, index].sum())
        sizes[index] = np.fromiter((0 if v is None else len(v) for v in values), np.int64, n)
    for index, field in enumerate(layout.fields):  # an id list and its weights, one per id
        if field.kind is RecordKind.WEIGHTS:
            ids = next(
                i
                for i, f in enumerate(layout.fields)
                if f.kind is RecordKind.ID_LIST and f.column == field.pairs
            )
            both = rows.present[:, ids] & rows.present[:, index]
            paired = both & (sizes[ids] // 8 == sizes[index] // 4)
            malformed += int((both & ~paired).sum())
            rows.present[:, ids] &= paired
            rows.present[:, index] &= paired
            rows.ints[~paired, layout.count(RecordKind.ID) + field.pairs] = 0  # an empty list
            rows.floats[~paired, field.column : field.column + field.width] = 0
    _warn(side, malformed)
    return rows


def parse_packed(
    values: Sequence[bytes | None], layout: RecordLayout, side: str, max_bytes: int
) -> RecordRows:
    """The records of ``MGET`` values in the packed layout (``None``: no key); one compiled
    pass over the values laid end to end (a value over ``max_bytes`` is absent, never
    copied)."""
    values = _bounded(values, max_bytes, side)
    n = len(values)
    rows = RecordRows.defaults(n, layout)
    lengths = np.fromiter((-1 if v is None else len(v) for v in values), np.int64, n)
    data = np.frombuffer(b"".join(v for v in values if v is not None), dtype=np.uint8)
    at = next(i for i, f in enumerate(layout.fields) if f.kind is RecordKind.VECTOR)
    id_first = layout.fields[0].kind is RecordKind.ID
    cap = layout.list_caps[0] if layout.list_caps else 0
    shaped, finite = _parse_packed(
        data, lengths, id_first, layout.fields[at].width, cap, len(layout.list_caps) > 0,
        rows.ints, rows.floats, rows.side,
    )  # fmt: skip
    rows.present[:] = shaped[:, None]
    rows.present[:, at] &= finite
    _warn(side, int((lengths >= 0).sum() - shaped.sum()) + int((shaped & ~finite).sum()))
    return rows


@kernel
def _parse_packed(
    data: npt.NDArray[np.uint8],
    lengths: npt.NDArray[np.int64],
    id_first: bool,
    dim: int,
    cap: int,
    has_list: bool,
    ints: npt.NDArray[np.int64],
    floats: npt.NDArray[np.float32],
    side: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Item values (``int64`` id, ``float32[dim]``) or user values (``float32[dim]`` then
    ``int64[k]``, ``k`` kept up to ``cap``) into rows; which values have the layout's shape,
    and which of those a finite vector (a vector that is not is left out, as zeros)."""
    shaped = np.zeros(len(lengths), dtype=np.bool_)
    finite = np.zeros(len(lengths), dtype=np.bool_)
    at = 0
    for i in range(len(lengths)):
        size = lengths[i]
        if size < 0:
            continue
        start = at
        at += size
        head = 8 if id_first else 0
        tail = size - head - 4 * dim
        if tail < 0 or (id_first and tail != 0) or tail % 8 != 0 or (tail and not has_list):
            continue
        shaped[i] = True
        vector = data[start + head : start + head + 4 * dim].view(np.float32)
        if np.isfinite(vector).all():
            finite[i] = True
            floats[i, :] = vector
        if id_first:
            ints[i, 0] = data[start : start + 8].view(np.int64)[0]
        elif has_list:
            count = min(tail // 8, cap)
            first = start + 4 * dim
            ints[i, 0] = count
            side[i, :count] = data[first : first + 8 * count].view(np.int64)
    return shaped, finite


def _bounded(values: Sequence[bytes | None], max_bytes: int, side: str) -> list[bytes | None]:
    """``values`` with each one over ``max_bytes`` (``redis.max_value_bytes``) as missing."""
    too_large = sum(1 for v in values if v is not None and len(v) > max_bytes)
    if not too_large:
        return list(values)
    log.warning(
        "%d %s feature values over redis.max_value_bytes=%d; served as missing",
        too_large, side, max_bytes,
    )  # fmt: skip
    return [None if v is not None and len(v) > max_bytes else v for v in values]


def _warn(side: str, malformed: int) -> None:
    if malformed:
        log.warning("%d malformed %s feature values; served as missing", malformed, side)


def write_hashes(
    client: redis.Redis,
    layout: RecordLayout,
    ids: Sequence[int],
    values: Sequence[Mapping[str, Any]],
) -> int:
    """Write records in ``layout`` (hash format), pipelined: what a feature pipeline writes.

    Args:
        client: a Redis client.
        layout: the layout (its ``format`` must be ``hash``).
        ids: the users' (items') ids.
        values: per id, field name -> a float32 vector (or weights), an int id, or a list of
            int ids.

    Returns:
        Records written.
    """
    if layout.format is not RecordFormat.HASH:
        raise ValueError("write_hashes writes the hash format")
    pipe = client.pipeline(transaction=False)
    for record_id, record in zip(ids, values, strict=True):
        mapping: dict[Any, Any] = {}
        for field in layout.fields:
            value = record[field.name]
            if field.kind in (RecordKind.VECTOR, RecordKind.WEIGHTS):
                mapping[field.name] = np.asarray(value, dtype="<f4").tobytes()
            elif field.kind is RecordKind.ID:
                mapping[field.name] = str(int(value)).encode()
            else:
                mapping[field.name] = np.asarray(value, dtype="<i8").tobytes()
        pipe.hset(layout.key.replace("{id}", str(record_id)), mapping=mapping)
    pipe.execute()
    return len(ids)
