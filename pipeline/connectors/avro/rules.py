"""The validation rules of a UserEvent, in one place for both decoders.

The compiled kernel (:mod:`pipeline.connectors.avro.kernels`) and the fastavro reference
(:mod:`pipeline.connectors.avro.reference`) apply the same rules, in the same order, with the
constants and limits defined here; a property test holds them to the same verdicts
(``tests/pipeline/stages/test_decode.py``).

Rules, in the order they are checked (the first failing one is the reason):

1. the value is present and non-empty (``empty_value``), at most ``codec.max_message_bytes``
   (``oversized_message``);
2. it decodes with the UserEvent schema and nothing is left over (``undecodable``; Confluent
   framing adds ``bad_framing``, ``unknown_schema``, ``schema_mismatch``);
3. at least one candidate (``no_candidates``), unless retrieval is on (``retrieval.enabled``:
   :attr:`Limits.retrieve`), where none asks for retrieved ones; at most
   ``codec.max_candidates`` (``too_many_candidates``);
4. at most ``codec.max_recent_items`` recent items (``too_many_recent_items``); up to that,
   they are truncated to the model's ``recent_items_cap`` (newest first kept);
5. ``user_id`` and every item id in ``[0, codec.max_id]`` (``id_out_of_range``);
6. ``1 <= num_results <= codec.max_num_results`` (``invalid_field``);
7. ``event_id``, ``context.device``, ``context.country``: 1 to ``codec.max_string_length``
   characters (``invalid_string``);
8. ``event_time`` between :data:`EARLIEST_EVENT_MS` and ``codec.max_event_time_ahead_s`` from
   now (``invalid_event_time``).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass

from pipeline.settings.codec import CodecSettings
from pipeline.types import RejectReason

STATUS_OK = 0
STATUS_EMPTY = 1
STATUS_OVERSIZED = 2
STATUS_UNDECODABLE = 3
STATUS_NO_CANDIDATES = 4
STATUS_TOO_MANY_CANDIDATES = 5
STATUS_ID_OUT_OF_RANGE = 6
STATUS_INVALID_FIELD = 7
STATUS_SLOW_PATH = 8
"""Not judged by the kernel (e.g. a Confluent writer schema that differs from ours): the
reference decides."""
STATUS_TOO_MANY_RECENT_ITEMS = 9
STATUS_INVALID_STRING = 10
STATUS_INVALID_EVENT_TIME = 11

STATUS_REASONS: dict[int, RejectReason] = {
    STATUS_EMPTY: RejectReason.EMPTY,
    STATUS_OVERSIZED: RejectReason.OVERSIZED,
    STATUS_UNDECODABLE: RejectReason.UNDECODABLE,
    STATUS_NO_CANDIDATES: RejectReason.NO_CANDIDATES,
    STATUS_TOO_MANY_CANDIDATES: RejectReason.TOO_MANY_CANDIDATES,
    STATUS_ID_OUT_OF_RANGE: RejectReason.ID_OUT_OF_RANGE,
    STATUS_INVALID_FIELD: RejectReason.INVALID_FIELD,
    STATUS_TOO_MANY_RECENT_ITEMS: RejectReason.TOO_MANY_RECENT_ITEMS,
    STATUS_INVALID_STRING: RejectReason.INVALID_STRING,
    STATUS_INVALID_EVENT_TIME: RejectReason.INVALID_EVENT_TIME,
}
"""The reason each kernel status stands for."""

EARLIEST_EVENT_MS = 100_000_000_000
"""1973-03-03: an ``event_time`` before it was most likely sent in seconds (epoch seconds stay
below it until the year 5138)."""

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MILLISECOND = datetime.timedelta(milliseconds=1)


def epoch_millis(value: int | datetime.datetime) -> int:
    """fastavro decodes timestamp-millis to an aware datetime: exact integer milliseconds."""
    if isinstance(value, int):
        return value
    return (value - _EPOCH) // _MILLISECOND


@dataclass(frozen=True)
class Limits:
    """The limits the rules check, from ``[codec]`` and the served model.

    Attributes:
        max_message_bytes / max_candidates / max_id / max_num_results / max_recent_items /
            max_string_length: ``codec.*``.
        recent_cap: ``recent_item_ids`` beyond this are dropped (the model's cap).
        max_event_time_ahead_s: ``codec.max_event_time_ahead_s``.
        retrieve: an empty ``candidate_item_ids`` is valid (it asks for retrieved candidates,
            ``retrieval.enabled``); off: it is rejected as ``no_candidates``.

    Example::

        limits = Limits.from_settings(CodecSettings(), recent_cap=20, retrieve=True)
        limits.latest_event_ms()
    """

    max_message_bytes: int
    max_candidates: int
    max_id: int
    max_num_results: int
    max_recent_items: int
    max_string_length: int
    recent_cap: int
    max_event_time_ahead_s: float
    retrieve: bool = False

    @classmethod
    def from_settings(cls, codec: CodecSettings, recent_cap: int, retrieve: bool = False) -> Limits:
        return cls(
            max_message_bytes=codec.max_message_bytes,
            max_candidates=codec.max_candidates,
            max_id=codec.max_id,
            max_num_results=codec.max_num_results,
            max_recent_items=codec.max_recent_items,
            max_string_length=codec.max_string_length,
            recent_cap=recent_cap,
            max_event_time_ahead_s=codec.max_event_time_ahead_s,
            retrieve=retrieve,
        )

    def latest_event_ms(self, now_s: float | None = None) -> int:
        """The latest ``event_time`` accepted at ``now_s`` (default: now)."""
        now = time.time() if now_s is None else now_s
        return int(now * 1000 + self.max_event_time_ahead_s * 1000)
