"""The configured decoder's per-message path: one fastavro record at a time.

Each message is read with fastavro (raw framing, or the Confluent header and the registry's
writer schema resolved into the configured one), validated by the same rules as the built-in
UserEvent (:mod:`pipeline.connectors.avro.rules`, applied to the role fields), and its values
appended to per-field lists; one numpy array per column is made at the end. Beyond the built-in
rules, ids of ``identity`` features configured with ``out_of_range = "dlq"`` must lie in their
table (``id_out_of_range``, naming the key), string feature fields obey
``codec.max_string_length`` (``invalid_string``), and a weighted key's ids come with one finite
weight each (``invalid_field``, naming the key).

It is the reference of the compiled walk (:mod:`pipeline.stages.decode.configured`), which asks
it about every message the walk does not accept (for the reason and detail of its dead letter,
or for a writer schema that is not the configured one), and the whole path for a schema the
walker does not take.

Example::

    records = RecordDecoder(settings.codec, fmap)
    rows = [records.event(value) for value in values]   # RejectedMessage for a bad one
    events = records.columns(rows)
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import numpy as np

from model.features.mapping import EventField, FeatureMap, SparseKey, Store
from model.features.segments import offsets
from model.features.spec import string_to_id
from pipeline.connectors.avro.reference import make_framing
from pipeline.connectors.avro.rules import EARLIEST_EVENT_MS, Limits, epoch_millis
from pipeline.connectors.avro.schema_fields import FieldKind, named_types, schema_node
from pipeline.settings.codec import CodecSettings
from pipeline.settings.features import OutOfRange, Source, Transform
from pipeline.types import EventColumns, FieldColumns, RejectedMessage
from pipeline.types import RejectReason as Why

__all__ = ["RecordDecoder"]

_CATEGORICAL_CACHE = 100_000
"""Distinct strings whose 64-bit hash is remembered (cleared when full)."""


class RecordDecoder:
    """One message at a time, with fastavro (see the module docstring).

    Args:
        settings: framing, registry and limits (``[codec]``).
        fmap: the feature map (roles, event fields, the ``dlq`` id checks).
        retrieve: accept events without candidates (``retrieval.enabled``); off:
            ``no_candidates``.
    """

    def __init__(self, settings: CodecSettings, fmap: FeatureMap, retrieve: bool = False) -> None:
        self.limits = Limits.from_settings(settings, recent_cap=0, retrieve=retrieve)
        self.framing = make_framing(settings, Path(fmap.schema_name))
        self._fmap = fmap
        self._strings: dict[str, int] = {}
        self._checks = _range_checks(fmap)
        self._raw = {
            f.field.path: _RawWriter(fmap.schema, f.field.name)
            for f in fmap.event_fields
            if f.store is Store.RAW
        }

    def columns(self, rows: list[tuple[Any, ...]]) -> EventColumns:
        """The events :meth:`event` returned, as columns (in the order given)."""
        batch = _Batch(self._fmap)
        for row in rows:
            batch.add(*row)
        return batch.columns()

    def event(self, value: bytes | None) -> tuple[Any, ...]:
        """One message's role values and field values, or the first rule it breaks."""
        limits, roles = self.limits, self._fmap.roles
        if not value:
            raise RejectedMessage(Why.EMPTY, "message value is empty or null")
        if len(value) > limits.max_message_bytes:
            raise RejectedMessage(
                Why.OVERSIZED,
                f"{len(value)} bytes > codec.max_message_bytes={limits.max_message_bytes}",
            )
        record = self.framing.read(value)
        candidates = roles.candidates.read(record) or []
        if not candidates and not limits.retrieve:
            raise RejectedMessage(
                Why.NO_CANDIDATES, f"{roles.candidates.name} is empty (and retrieval is off)"
            )
        if len(candidates) > limits.max_candidates:
            raise RejectedMessage(
                Why.TOO_MANY_CANDIDATES,
                f"{len(candidates)} candidates > codec.max_candidates={limits.max_candidates}",
            )
        user_id = roles.user_id.read(record)
        if not 0 <= user_id <= limits.max_id:
            raise RejectedMessage(
                Why.ID_OUT_OF_RANGE,
                f"{roles.user_id.name} {user_id} not in [0, {limits.max_id}]",
            )
        if candidates and not 0 <= min(candidates) <= max(candidates) <= limits.max_id:
            bad = min(candidates) if min(candidates) < 0 else max(candidates)
            raise RejectedMessage(Why.ID_OUT_OF_RANGE, f"item id {bad} not in [0, {limits.max_id}]")
        num_results = roles.num_results_default
        if roles.num_results is not None:
            read = roles.num_results.read(record)
            num_results = roles.num_results_default if read is None else read
        if not 1 <= num_results <= limits.max_num_results:
            raise RejectedMessage(
                Why.INVALID_FIELD,
                f"num_results {num_results} not in [1, {limits.max_num_results}]",
            )
        event_id = roles.event_id.read(record)
        event_id = event_id if isinstance(event_id, str) else str(event_id)
        self._check_string(roles.event_id.name, event_id)
        event_ms = epoch_millis(roles.event_time.read(record))
        if not EARLIEST_EVENT_MS <= event_ms <= limits.latest_event_ms():
            raise RejectedMessage(
                Why.INVALID_EVENT_TIME,
                f"event_time {event_ms} ms is before 1973 (seconds, not milliseconds?) or "
                f"more than {limits.max_event_time_ahead_s:.0f}s ahead",
            )
        fields = [self._field(f, f.field.read(record)) for f in self._fmap.event_fields]
        for check in self._checks:
            check(fields, candidates)
        weights = [_weights(f, record) for f in self._fmap.event_fields]
        return event_id, user_id, event_ms, num_results, candidates, fields, weights

    def _check_string(self, name: str, text: str) -> None:
        if not 0 < len(text) <= self.limits.max_string_length:
            raise RejectedMessage(
                Why.INVALID_STRING,
                f"{name} has {len(text)} characters, not in [1, {self.limits.max_string_length}]",
            )

    def _field(self, f: EventField, value: Any) -> Any:
        """One event field's value as its store keeps it (int, float, list of ints, or its
        Avro bytes; a null list ``None``)."""
        kind = f.field.kind
        if f.store is Store.RAW:
            return None if value is None else self._raw[f.field.path](value)
        if f.store is Store.FLOATS:
            return float("nan") if value is None else float(value)
        if value is None:
            return None
        if kind is FieldKind.STRING:
            value = self._hash(f.field.name, value)
        elif kind is FieldKind.STRING_LIST:
            value = [self._hash(f.field.name, v) for v in value[: f.max_ids]]
        elif kind is FieldKind.INT_LIST:
            value = value[: f.max_ids]
        if f.store is Store.LISTS and not isinstance(value, list):
            return [int(value)]
        return value

    def _hash(self, name: str, text: str) -> int:
        """:func:`model.features.spec.string_to_id` of a string field's value, cached."""
        found = self._strings.get(text)
        if found is None:
            self._check_string(name, text)
            if len(self._strings) >= _CATEGORICAL_CACHE:
                self._strings.clear()
            found = self._strings[text] = string_to_id(text)
        return found


def _weights(f: EventField, record: Any) -> list[float] | None:
    """The weights of a weighted key's list (its kept ids'), ``None`` for another field or a
    null list.

    Raises:
        RejectedMessage: not one weight per id (a null array has none), or one not finite.
    """
    if f.weights is None:
        return None
    ids = f.field.read(record)
    if ids is None:
        return None
    weights = f.weights.read(record) or []
    if len(weights) != len(ids):
        raise RejectedMessage(
            Why.INVALID_FIELD,
            f"features.sparse.{f.key}: {len(weights)} weights ({f.weights.name}) for "
            f"{len(ids)} ids ({f.field.name}): one weight per id",
        )
    with np.errstate(over="ignore"):  # a double beyond float32: inf, refused below
        kept = np.asarray(weights[: f.max_ids], dtype=np.float32)
    if not np.isfinite(kept).all():
        bad = next(w for w, ok in zip(weights, np.isfinite(kept), strict=False) if not ok)
        raise RejectedMessage(
            Why.INVALID_FIELD,
            f"features.sparse.{f.key}: weight {bad} in {f.weights.name} is not a finite float32",
        )
    return kept.tolist()


@dataclass(frozen=True)
class _RangeCheck:
    """An ``identity`` key configured to dead-letter outside ids (``out_of_range = "dlq"``).

    Attributes:
        key: the key (its table's rows).
        position: which of the event's field values holds its ids; ``None``: the candidates.
    """

    key: SparseKey
    position: int | None

    def __call__(self, fields: list[Any], candidates: list[int]) -> None:
        held = candidates if self.position is None else fields[self.position]
        for v in held if isinstance(held, list) else [] if held is None else [held]:
            if not 0 <= v < self.key.num_rows:
                raise RejectedMessage(
                    Why.ID_OUT_OF_RANGE,
                    f"features.sparse.{self.key.key}: id {v} not in [0, {self.key.num_rows}) "
                    "(identity, out_of_range = dlq)",
                )


def _range_checks(fmap: FeatureMap) -> list[_RangeCheck]:
    """One check per ``identity`` key configured to dead-letter outside ids."""
    checks = []
    for key in fmap.sparse:
        if key.transform is not Transform.IDENTITY or key.out_of_range is not OutOfRange.DLQ:
            continue
        position = None
        if key.source is Source.EVENT:
            position = next(
                i for i, f in enumerate(fmap.event_fields)
                if f.store is key.store and f.column == key.column
            )  # fmt: skip
        checks.append(_RangeCheck(key, position))
    return checks


class _RawWriter:
    """A field's value -> its Avro encoding (what the compiled walk cuts out of the body)."""

    def __init__(self, schema: Any, dotted: str) -> None:
        node, _ = schema_node(schema, dotted)
        wrapper = {"type": "record", "name": "streamrank.Raw", "fields": [
            {"name": "v", "type": node},
        ]}  # fmt: skip
        self._schema = fastavro.parse_schema(wrapper, named_schemas=dict(named_types(schema)))

    def __call__(self, value: Any) -> bytes:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, self._schema, {"v": value})
        return buf.getvalue()


class _Batch:
    """The accepted events' values, appended per event, made columns once."""

    def __init__(self, fmap: FeatureMap) -> None:
        self._fmap = fmap
        self.rows: list[tuple[Any, ...]] = []

    def add(self, *event: Any) -> None:
        self.rows.append(event)

    def columns(self) -> EventColumns:
        rows, n = self.rows, len(self.rows)
        ids = [r[0].encode() for r in rows]
        id_lengths = np.fromiter(map(len, ids), np.int64, n)
        counts = np.fromiter((len(r[4]) for r in rows), np.int64, n)
        zeros = np.zeros(n, dtype=np.int64)
        return EventColumns(
            event_id_bytes=np.frombuffer(b"".join(ids), dtype=np.uint8).copy(),
            event_id_offsets=offsets(id_lengths),
            user_ids=np.fromiter((r[1] for r in rows), np.int64, n),
            event_time_ms=np.fromiter((r[2] for r in rows), np.int64, n),
            device_ids=zeros,
            country_ids=zeros.copy(),
            num_results=np.fromiter((r[3] for r in rows), np.int64, n),
            candidate_counts=counts,
            candidate_ids=np.fromiter((c for r in rows for c in r[4]), np.int64, int(counts.sum())),
            recent_counts=zeros.copy(),
            recent_ids=np.zeros(0, dtype=np.int64),
            retrieved=np.zeros(n, dtype=bool),
            fields=self._fields([r[5] for r in rows], [r[6] for r in rows]),
        )

    def _fields(self, values: list[list[Any]], weights: list[list[Any]]) -> FieldColumns:
        """The event fields of every accepted event (``values[event][field]``; a weighted
        key's list's ``weights[event][field]``)."""
        n, fmap = len(values), self._fmap
        out = FieldColumns.empty(
            n, fmap.event_count(Store.INTS), fmap.event_count(Store.FLOATS),
            fmap.event_count(Store.LISTS), fmap.event_count(Store.RAW),
        )  # fmt: skip
        lists: list[list[list[int]]] = [[] for _ in range(fmap.event_count(Store.LISTS))]
        raw: list[list[bytes | None]] = [[] for _ in range(fmap.event_count(Store.RAW))]
        for at, f in enumerate(fmap.event_fields):
            column = [v[at] for v in values]
            if f.store is Store.RAW:
                raw[f.column] = column
                out.raw_present[:, f.column] = [b is not None for b in column]
                out.raw_counts[:, f.column] = [len(b or b"") for b in column]
            elif f.store is Store.INTS:
                out.ints[:, f.column] = np.fromiter(column, np.int64, n)
            elif f.store is Store.FLOATS:
                out.floats[:, f.column] = np.fromiter(column, np.float32, n)
            else:
                present = np.fromiter((v is not None for v in column), bool, n)
                column = [[] if v is None else v for v in column]
                out.list_counts[:, f.column] = np.fromiter(map(len, column), np.int64, n)
                out.list_present[:, f.column] = present
                lists[f.column] = column
        if lists:  # entity-major: each event's lists one after another
            flat = [v for e in range(n) for one in lists for v in one[e]]
            out.list_ids = np.fromiter(flat, np.int64, len(flat))
        if raw:  # entity-major too
            data = b"".join(one[e] or b"" for e in range(n) for one in raw)
            out.raw_bytes = np.frombuffer(data, dtype=np.uint8).copy()
        if any(f.weights is not None for f in fmap.event_fields):
            at_column = {
                f.column: at for at, f in enumerate(fmap.event_fields) if f.store is Store.LISTS
            }
            flat_w = [
                w
                for e in range(n)
                for column, one in enumerate(lists)
                for w in (weights[e][at_column[column]] or [1.0] * len(one[e]))
            ]
            out.list_weights = np.fromiter(flat_w, np.float32, len(flat_w))
        return out
