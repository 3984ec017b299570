"""Decode any event schema of the user's (``[events]``): one compiled walk for the whole poll,
fastavro for the exceptions.

As the built-in decoder (:mod:`pipeline.stages.decode.compiled`) does for UserEvent: the bodies
of a poll are laid end to end in one buffer and walked by the compiled interpreter of the
schema (:mod:`pipeline.connectors.avro.walker`, a program made once from the schema and the
fields the feature map reads); the slots become columns and every rule is checked over whole
columns (:mod:`pipeline.stages.decode.walked`). The per-message fastavro path
(:mod:`pipeline.stages.decode.records`) is asked only about the exceptions: each message the walk
rejects or flags (its dead letter gets that path's reason and detail), and Confluent messages
whose writer schema is not the configured one (schema resolution is fastavro's job). A schema
the walker does not take (a recursive type, microsecond times) decodes with fastavro alone.

Example::

    decoder = ConfiguredDecoder(settings.codec, resolve_feature_map(settings))
    decoded = decoder.decode(polled)   # a PolledBatch of the input topic
    decoded.events.fields.ints     # the feature map's single ids, one row per event
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from itertools import compress
from typing import cast

import numpy as np
import numpy.typing as npt

from model.features.mapping import FeatureMap, Store
from pipeline.connectors.avro import framing as wire
from pipeline.connectors.avro.program import Program, UnsupportedSchema, compile_program
from pipeline.connectors.avro.rules import (
    STATUS_EMPTY,
    STATUS_OK,
    STATUS_OVERSIZED,
    STATUS_SLOW_PATH,
)
from pipeline.connectors.avro.walker import WalkOutputs, walk
from pipeline.settings.codec import CodecSettings, Framing
from pipeline.stages.decode.messages import decoded_messages, value_sizes
from pipeline.stages.decode.records import RecordDecoder
from pipeline.stages.decode.walked import WalkedColumns
from pipeline.types import DecodedMessages, EventColumns, PolledBatch, RejectedMessage

__all__ = ["ConfiguredDecoder"]

log = logging.getLogger(__name__)

I64 = npt.NDArray[np.int64]


class ConfiguredDecoder:
    """Consumed messages of the configured schema -> :class:`~pipeline.types.DecodedMessages`.

    Args:
        settings / fmap / retrieve: as :class:`~pipeline.stages.decode.records.RecordDecoder`
            takes them (framing and limits; the feature map; events without candidates).
    """

    def __init__(self, settings: CodecSettings, fmap: FeatureMap, retrieve: bool = False) -> None:
        self.records = RecordDecoder(settings, fmap, retrieve)
        self._framing = settings.framing
        self._same_schema: dict[int, bool] = {}
        roles = fmap.roles
        wanted = [roles.event_id, roles.user_id, roles.candidates, roles.event_time]
        wanted += [roles.num_results] if roles.num_results is not None else []
        wanted += [f.field for f in fmap.event_fields if f.store is not Store.RAW]
        wanted += [f.weights for f in fmap.event_fields if f.weights is not None]
        raw = [f.field for f in fmap.event_fields if f.store is Store.RAW]
        self._program: Program | None = None
        try:
            self._program = compile_program(fmap.schema, wanted, raw)
        except UnsupportedSchema as why:
            log.info("decoding %s with fastavro alone: %s", fmap.schema_name, why)
        if self._program is not None:
            self._walked = WalkedColumns(self._program, fmap, self.records.limits)
            self.decode_values([])  # load (or compile) the walker now, not on the first batch

    def decode(self, messages: PolledBatch) -> DecodedMessages:
        """Decode and validate ``messages`` (in consumption order)."""
        return decoded_messages(messages, self.decode_values)

    def decode_values(
        self, values: list[bytes | None], lengths: I64 | None = None
    ) -> tuple[EventColumns, I64, list[tuple[int, RejectedMessage]]]:
        """Decode message values (``lengths``: their sizes, -1 for null, when known).

        Returns:
            The accepted events (in message order), int64[E] the index of each one's value, and
            ``(index, why)`` of every rejected value, in order.
        """
        if self._program is None:
            status = np.full(len(values), STATUS_SLOW_PATH, dtype=np.int8)
            return self._with_exceptions(values, status, np.zeros(0, np.int64), None)
        status, events = self._kernel(values, lengths)
        ok = np.flatnonzero(status == STATUS_OK)
        if len(ok) == len(values):
            return events, ok, []
        return self._with_exceptions(values, status, ok, events)

    def _kernel(
        self, values: list[bytes | None], lengths: I64 | None
    ) -> tuple[npt.NDArray[np.int8], EventColumns]:
        """The compiled pass: per-value status and the accepted events' columns."""
        assert self._program is not None
        n = len(values)
        sizes = value_sizes(values, lengths)
        oversized = sizes > self.records.limits.max_message_bytes
        # Oversized values are refused before they are copied: they take no room in ``buf``.
        lengths = np.where(oversized, 0, sizes)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        status = np.zeros(n, dtype=np.int8)
        status[sizes == 0] = STATUS_EMPTY
        status[oversized] = STATUS_OVERSIZED
        kept = cast(Iterable[bytes], compress(values, lengths))
        buf = np.frombuffer(b"".join(kept), dtype=np.uint8)
        if self._framing is Framing.CONFLUENT:
            starts = self._skip_headers(buf, starts, lengths, status)
        out = WalkOutputs.allocate(self._program, n, len(buf))
        walk(buf, starts, ends, status, self._program, out)
        walked = np.flatnonzero(status == STATUS_OK)
        events, bad = self._walked.columns(buf, out, walked)
        status[walked[bad]] = STATUS_SLOW_PATH  # breaks a rule: the record path says which
        return status, events.take(np.flatnonzero(~bad)) if bad.any() else events

    def _skip_headers(
        self, buf: npt.NDArray[np.uint8], starts: I64, lengths: I64, status: npt.NDArray[np.int8]
    ) -> I64:
        """Confluent framing: bodies start after the header; other writer schemas, and values
        that are not framed, take the record path."""
        framed, ids = wire.schema_ids(buf, starts, lengths)
        status[(status == STATUS_OK) & ~framed] = STATUS_SLOW_PATH
        for schema_id in np.unique(ids[framed]).tolist():
            same = self._same_schema.get(schema_id)
            if same is None:
                same = self._same_schema[schema_id] = self.records.framing.writer_is_reader(
                    schema_id
                )
            if not same:
                status[framed & (ids == schema_id)] = STATUS_SLOW_PATH
        return starts + wire.HEADER_BYTES

    def _with_exceptions(
        self,
        values: list[bytes | None],
        status: npt.NDArray[np.int8],
        ok: I64,
        events: EventColumns | None,
    ) -> tuple[EventColumns, I64, list[tuple[int, RejectedMessage]]]:
        """Ask the record path about every value the walk did not accept."""
        rejections: list[tuple[int, RejectedMessage]] = []
        slow_index: list[int] = []
        rows = []
        for i in np.flatnonzero(status != STATUS_OK).tolist():
            try:
                rows.append(self.records.event(values[i]))
                slow_index.append(i)
            except RejectedMessage as rejection:
                rejections.append((i, rejection))
        slow = self.records.columns(rows)
        if events is None:
            return slow, np.asarray(slow_index, dtype=np.int64), rejections
        if not rows:
            return events, ok, rejections
        merged = EventColumns.concat([events, slow])
        accepted = np.concatenate([ok, np.asarray(slow_index, dtype=np.int64)])
        order = np.argsort(accepted, kind="stable")
        return merged.take(order), accepted[order], rejections
