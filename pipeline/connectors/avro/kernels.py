"""Compiled (numba) Avro kernels for the UserEvent and Recommendation schemas.

The decoder walks a batch of message bodies laid end to end in one ``uint8`` buffer and writes
numpy columns; it never builds a Python object per event. It applies the rules of
:mod:`pipeline.connectors.avro.rules` and answers with their ``STATUS_*`` codes; the decode stage
(:mod:`pipeline.stages.decode`) asks the fastavro reference
(:mod:`pipeline.connectors.avro.reference`) for the human-readable detail of each reject.

Binary encoding (Avro 1.11 spec): ``long``/``int`` are zigzag varints; ``string`` is a long
length then UTF-8 bytes; arrays are blocks (a long count, negative: followed by a long byte
size; a zero count ends); a union is a long branch index then the branch.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from model.kernels import kernel
from pipeline.connectors.avro.rules import (
    STATUS_ID_OUT_OF_RANGE,
    STATUS_INVALID_EVENT_TIME,
    STATUS_INVALID_FIELD,
    STATUS_INVALID_STRING,
    STATUS_NO_CANDIDATES,
    STATUS_OK,
    STATUS_TOO_MANY_CANDIDATES,
    STATUS_TOO_MANY_RECENT_ITEMS,
    STATUS_UNDECODABLE,
)

_MIN_MILLIS = -62_135_596_800_000
_MAX_MILLIS = 253_402_300_799_999
"""timestamp-millis that fastavro can turn into a datetime (years 1-9999)."""
_INT_MIN = -(2**31)
_INT_MAX = 2**31 - 1


@kernel
def _varint(buf: npt.NDArray[np.uint8], pos: int, end: int) -> tuple[int, int]:
    """Zigzag varint at ``pos``; returns (value, next pos), next pos -1 past ``end``."""
    result = np.uint64(0)
    shift = 0
    while True:
        if pos >= end:
            return 0, -1
        b = np.uint64(buf[pos])
        pos += 1
        if shift < 64:
            result |= (b & np.uint64(0x7F)) << np.uint64(shift)
        shift += 7
        if b < np.uint64(0x80):
            break
    value = np.int64(result >> np.uint64(1)) ^ -np.int64(result & np.uint64(1))
    return int(value), pos


@kernel
def _utf8_ok(buf: npt.NDArray[np.uint8], start: int, end: int) -> bool:
    """Whether ``buf[start:end]`` is valid UTF-8 (what Python's strict decoder accepts)."""
    i = start
    while i < end:
        b = buf[i]
        if b < 0x80:
            i += 1
            continue
        if 0xC2 <= b <= 0xDF:
            n, lo, hi = 1, 0x80, 0xBF
        elif b == 0xE0:
            n, lo, hi = 2, 0xA0, 0xBF
        elif 0xE1 <= b <= 0xEC or 0xEE <= b <= 0xEF:
            n, lo, hi = 2, 0x80, 0xBF
        elif b == 0xED:
            n, lo, hi = 2, 0x80, 0x9F
        elif b == 0xF0:
            n, lo, hi = 3, 0x90, 0xBF
        elif 0xF1 <= b <= 0xF3:
            n, lo, hi = 3, 0x80, 0xBF
        elif b == 0xF4:
            n, lo, hi = 3, 0x80, 0x8F
        else:
            return False
        if i + n >= end:
            return False
        if not lo <= buf[i + 1] <= hi:
            return False
        for k in range(2, n + 1):
            if not 0x80 <= buf[i + k] <= 0xBF:
                return False
        i += n + 1
    return True


@kernel
def _string(buf: npt.NDArray[np.uint8], pos: int, end: int) -> tuple[int, int, int]:
    """A string at ``pos``: (start, length, next pos); next pos -1 when malformed."""
    length, pos = _varint(buf, pos, end)
    if pos < 0 or length < 0 or pos + length > end or not _utf8_ok(buf, pos, pos + length):
        return 0, 0, -1
    return pos, length, pos + length


@kernel
def _long_array(
    buf: npt.NDArray[np.uint8], pos: int, end: int, out: npt.NDArray[np.int64], n_out: int
) -> tuple[int, int]:
    """An array of longs appended to ``out[n_out:]``: (items read, next pos or -1)."""
    count = 0
    while True:
        block, pos = _varint(buf, pos, end)
        if pos < 0:
            return count, -1
        if block == 0:
            return count, pos
        if block < 0:
            block = -block
            _, pos = _varint(buf, pos, end)  # the block's byte size, unused
            if pos < 0:
                return count, -1
        if block > end - pos:  # each long takes at least one byte
            return count, -1
        for _ in range(block):
            value, pos = _varint(buf, pos, end)
            if pos < 0:
                return count, -1
            out[n_out + count] = value
            count += 1


@kernel
def _fnv1a(buf: npt.NDArray[np.uint8], start: int, length: int) -> int:
    """64-bit FNV-1a of a byte range (a key for caching the categorical hash)."""
    h = np.uint64(0xCBF29CE484222325)
    for i in range(start, start + length):
        h = (h ^ np.uint64(buf[i])) * np.uint64(0x100000001B3)
    return int(np.int64(h ^ np.uint64(length)))


@kernel
def _event_header(
    buf: npt.NDArray[np.uint8],
    pos: int,
    end: int,
    ints: npt.NDArray[np.int64],
    strings: npt.NDArray[np.int64],
) -> int:
    """event_id, user_id, event_time, context: fills ``ints[:2]``, ``strings``; next pos or -1."""
    strings[0], strings[1], pos = _string(buf, pos, end)
    if pos < 0:
        return -1
    ints[0], pos = _varint(buf, pos, end)
    if pos < 0:
        return -1
    ints[1], pos = _varint(buf, pos, end)
    if pos < 0:
        return -1
    strings[2], strings[3], pos = _string(buf, pos, end)
    if pos < 0:
        return -1
    strings[4], strings[5], pos = _string(buf, pos, end)
    return pos


@kernel
def _strings_ok(buf: npt.NDArray[np.uint8], strings: npt.NDArray[np.int64], limit: int) -> bool:
    """event_id, device and country each hold 1 to ``limit`` characters (UTF-8 code points:
    the bytes that are not continuation bytes)."""
    for column in range(0, 6, 2):
        start, length = strings[column], strings[column + 1]
        chars = 0
        for i in range(start, start + length):
            if buf[i] & 0xC0 != 0x80:
                chars += 1
        if chars == 0 or chars > limit:
            return False
    return True


@kernel
def decode_user_events(
    buf: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    ends: npt.NDArray[np.int64],
    status: npt.NDArray[np.int8],
    ints: npt.NDArray[np.int64],
    strings: npt.NDArray[np.int64],
    candidate_counts: npt.NDArray[np.int64],
    candidate_ids: npt.NDArray[np.int64],
    recent_counts: npt.NDArray[np.int64],
    recent_ids: npt.NDArray[np.int64],
    max_candidates: int,
    max_id: int,
    max_num_results: int,
    recent_cap: int,
    max_recent_items: int,
    max_string_length: int,
    earliest_ms: int,
    latest_ms: int,
    retrieve: bool,
) -> tuple[int, int]:
    """Decode and validate UserEvent bodies ``buf[starts[i]:ends[i]]`` where ``status[i] == 0``.

    Args:
        buf: the bodies (framing headers skipped by ``starts``).
        starts / ends: int64[M] body bounds.
        status: int8[M], in: 0 to decode, anything else is kept; out: a ``STATUS_*`` code.
        ints: int64[M, 3] out: user_id, event_time, num_results.
        strings: int64[M, 6] out: (start, length) of event_id, device, country.
        candidate_counts / recent_counts: int64[M] out (0 for rejected messages).
        candidate_ids / recent_ids: flat outputs, sized for the worst case (len(buf)).
        max_candidates / max_id / max_num_results / recent_cap / max_recent_items /
            max_string_length: the validation limits (``codec.*``; strings in characters).
        earliest_ms / latest_ms: the accepted ``event_time`` range.
        retrieve: accept an event without candidates (it asks for retrieved ones).

    Returns:
        (candidate ids written, recent ids written); rejected messages write none.
    """
    n_cand = 0
    n_recent = 0
    for m in range(len(starts)):
        candidate_counts[m] = 0
        recent_counts[m] = 0
        if status[m] != STATUS_OK:
            continue
        end = ends[m]
        pos = _event_header(buf, starts[m], end, ints[m], strings[m])
        bad = pos < 0 or not _MIN_MILLIS <= ints[m, 1] <= _MAX_MILLIS
        n_c = 0
        if not bad:
            n_c, pos = _long_array(buf, pos, end, candidate_ids, n_cand)
            bad = pos < 0
        n_r = 0
        if not bad:
            branch, pos = _varint(buf, pos, end)
            if branch < 0:
                # fastavro (the reference) indexes the union's branches like a Python list, so
                # -1 and -2 name the array and null branches; agree with it.
                branch += 2
            if pos < 0 or branch < 0 or branch > 1:
                bad = True
            elif branch == 1:
                n_r, pos = _long_array(buf, pos, end, recent_ids, n_recent)
                bad = pos < 0
        if not bad:
            num_results, pos = _varint(buf, pos, end)
            bad = pos < 0 or num_results < _INT_MIN or num_results > _INT_MAX
            ints[m, 2] = num_results
        if bad or pos != end:
            status[m] = STATUS_UNDECODABLE
            continue
        if n_c == 0 and not retrieve:
            status[m] = STATUS_NO_CANDIDATES
            continue
        if n_c > max_candidates:
            status[m] = STATUS_TOO_MANY_CANDIDATES
            continue
        if n_r > max_recent_items:
            status[m] = STATUS_TOO_MANY_RECENT_ITEMS
            continue
        n_r = min(n_r, recent_cap)
        ok_ids = 0 <= ints[m, 0] <= max_id
        for i in range(n_cand, n_cand + n_c):
            ok_ids = ok_ids and 0 <= candidate_ids[i] <= max_id
        for i in range(n_recent, n_recent + n_r):
            ok_ids = ok_ids and 0 <= recent_ids[i] <= max_id
        if not ok_ids:
            status[m] = STATUS_ID_OUT_OF_RANGE
            continue
        if not 1 <= ints[m, 2] <= max_num_results:
            status[m] = STATUS_INVALID_FIELD
            continue
        if not _strings_ok(buf, strings[m], max_string_length):
            status[m] = STATUS_INVALID_STRING
            continue
        if not earliest_ms <= ints[m, 1] <= latest_ms:
            status[m] = STATUS_INVALID_EVENT_TIME
            continue
        candidate_counts[m] = n_c
        recent_counts[m] = n_r
        n_cand += n_c
        n_recent += n_r
    return n_cand, n_recent


@kernel
def string_keys(
    buf: npt.NDArray[np.uint8], strings: npt.NDArray[np.int64], column: int
) -> npt.NDArray[np.int64]:
    """FNV-1a keys of the string at ``strings[:, column]`` (start) / ``column + 1`` (length)."""
    out = np.empty(len(strings), dtype=np.int64)
    for m in range(len(strings)):
        out[m] = _fnv1a(buf, strings[m, column], strings[m, column + 1])
    return out


@kernel
def _put_long(out: npt.NDArray[np.uint8], pos: int, value: int) -> int:
    """Zigzag varint of ``value`` at ``out[pos:]``; returns the next position."""
    n = (np.uint64(value) << np.uint64(1)) ^ np.uint64(value >> 63)
    while n >= np.uint64(0x80):
        out[pos] = np.uint8((n & np.uint64(0x7F)) | np.uint64(0x80))
        n >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(n)
    return pos + 1


@kernel
def _put_bytes(
    out: npt.NDArray[np.uint8], pos: int, data: npt.NDArray[np.uint8], start: int, end: int
) -> int:
    """An Avro string/bytes: length, then ``data[start:end]``."""
    pos = _put_long(out, pos, end - start)
    out[pos : pos + end - start] = data[start:end]
    return pos + end - start


@kernel
def put_fallbacks(
    out: npt.NDArray[np.uint8],
    pos: int,
    user: bool,
    item: bool,
    names: npt.NDArray[np.uint8],
    name_offsets: npt.NDArray[np.int64],
) -> int:
    """``fallback_features``: an array of the names (user, item) of the groups that fell back."""
    flags = int(user) + int(item)
    if flags:
        pos = _put_long(out, pos, flags)
        if user:
            pos = _put_bytes(out, pos, names, name_offsets[0], name_offsets[1])
        if item:
            pos = _put_bytes(out, pos, names, name_offsets[1], name_offsets[2])
    out[pos] = 0  # end of the array
    return pos + 1


@kernel
def encode_recommendations(
    header: npt.NDArray[np.uint8],
    event_ids: npt.NDArray[np.uint8],
    event_id_offsets: npt.NDArray[np.int64],
    user_ids: npt.NDArray[np.int64],
    item_offsets: npt.NDArray[np.int64],
    item_ids: npt.NDArray[np.int64],
    score_bytes: npt.NDArray[np.uint8],
    model_version: npt.NDArray[np.uint8],
    scored_at: int,
    fallback_user: npt.NDArray[np.bool_],
    fallback_item: npt.NDArray[np.bool_],
    names: npt.NDArray[np.uint8],
    name_offsets: npt.NDArray[np.int64],
    retrieved: npt.NDArray[np.bool_],
    out: npt.NDArray[np.uint8],
    out_offsets: npt.NDArray[np.int64],
) -> None:
    """Recommendation records, one after the other, into ``out``.

    Args:
        header: written before each record (the Confluent header, or nothing).
        event_ids / event_id_offsets: UTF-8 event ids, event ``e`` at
            ``[offsets[e], offsets[e + 1])``.
        user_ids: int64[E].
        item_offsets: int64[E + 1] bounds of each event's items in ``item_ids``.
        item_ids: int64[K] best first within each event.
        score_bytes: the float64[K] scores viewed as bytes (little-endian).
        model_version: UTF-8 bytes.
        scored_at: epoch milliseconds.
        fallback_user / fallback_item: bool[E] the ``fallback_features`` flags.
        names / name_offsets: the two UTF-8 feature names (user, item).
        retrieved: bool[E] the ``retrieved`` field (the last one, one byte).
        out: large enough for every record (see :func:`recommendation_capacity`).
        out_offsets: int64[E + 1] out: record ``e`` is ``out[out_offsets[e]:out_offsets[e + 1]]``.
    """
    pos = 0
    for e in range(len(user_ids)):
        out_offsets[e] = pos
        out[pos : pos + len(header)] = header
        pos += len(header)
        pos = _put_bytes(out, pos, event_ids, event_id_offsets[e], event_id_offsets[e + 1])
        pos = _put_long(out, pos, user_ids[e])
        lo, hi = item_offsets[e], item_offsets[e + 1]
        if hi > lo:
            pos = _put_long(out, pos, hi - lo)
            for i in range(lo, hi):
                pos = _put_long(out, pos, item_ids[i])
                out[pos : pos + 8] = score_bytes[8 * i : 8 * i + 8]
                pos += 8
        out[pos] = 0  # end of the items array
        pos = _put_bytes(out, pos + 1, model_version, 0, len(model_version))
        pos = _put_long(out, pos, scored_at)
        pos = put_fallbacks(out, pos, fallback_user[e], fallback_item[e], names, name_offsets)
        out[pos] = 1 if retrieved[e] else 0  # retrieved (boolean: one byte)
        pos += 1
    out_offsets[len(user_ids)] = pos
