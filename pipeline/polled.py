"""Consumed messages as columns (:class:`PolledBatch`): what the Kafka edge hands the pipeline.

:mod:`pipeline.connectors.kafka` turns each poll of the consumer into one :class:`PolledBatch`
(one pass over the client's messages, which are dropped there); nothing after it sees a Kafka
client type. The source keeps a backlog of them, decode reads their values, the batcher cuts
and joins them in step with the events, and a dead letter takes one message back out whole
(:meth:`PolledBatch.message`: the only per-message object, on the dead-letter path alone).

Re-exported by :mod:`pipeline.types` (the types between the stages); kept apart, like
:mod:`pipeline.columns`, so that the bookkeeping of the columns (slicing, reordering, joining in
step) has a module of its own.

Example::

    polled = PolledBatch.of("user-events", values, keys, partitions, offsets, timestamps, headers)
    head, tail = polled.slice(0, 100), polled.slice(100)
    PolledBatch.concat([head, tail]).offsets
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["ConsumedMessage", "Headers", "Partition", "PolledBatch"]

Int64Array = npt.NDArray[np.int64]

Partition = tuple[str, int]
"""(topic, partition)."""

Headers = list[tuple[str, str | bytes | None]]
"""A message's headers, in order (a name may repeat)."""


@dataclass(frozen=True)
class ConsumedMessage:
    """One consumed message, whole: what a dead letter republishes untouched.

    Attributes:
        topic / partition / offset: where it was consumed.
        key / value: as consumed (``None``: null).
        headers: as consumed (``None``: none).
        timestamp_ms: its Kafka timestamp (producer or broker time), epoch milliseconds; -1
            when the client had none.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers | None
    timestamp_ms: int


@dataclass
class PolledBatch:
    """``M`` messages of one topic, in consumption order, as columns.

    Attributes:
        topic: the topic they were consumed from.
        values: per message, its value (``None``: null).
        value_lengths: int64[M] bytes of each value; -1 for a null one.
        keys: per message, its key (``None``: null).
        partitions / offsets: int64[M] where each message was consumed.
        timestamps_ms: int64[M] each message's Kafka timestamp, epoch milliseconds; -1 when
            the client had none.
        headers: per message, its headers (``None``: none).
    """

    topic: str
    values: list[bytes | None]
    value_lengths: Int64Array
    keys: list[bytes | None]
    partitions: Int64Array
    offsets: Int64Array
    timestamps_ms: Int64Array
    headers: list[Headers | None]

    @classmethod
    def of(
        cls,
        topic: str,
        values: list[bytes | None],
        keys: list[bytes | None] | None = None,
        partitions: list[int] | Int64Array | None = None,
        offsets: list[int] | Int64Array | None = None,
        timestamps_ms: list[int] | Int64Array | None = None,
        headers: list[Headers | None] | None = None,
    ) -> PolledBatch:
        """Messages from plain lists (the value lengths computed here); what is not given is
        null, partition 0, offsets 0, 1, ..., no timestamp.

        Example::

            PolledBatch.of("in", [b"a", None], partitions=[0, 1], offsets=[7, 3])
        """
        n = len(values)
        return cls(
            topic,
            list(values),
            np.fromiter((-1 if v is None else len(v) for v in values), np.int64, n),
            list(keys) if keys is not None else [None] * n,
            np.asarray(partitions if partitions is not None else np.zeros(n), dtype=np.int64),
            np.asarray(offsets if offsets is not None else np.arange(n), dtype=np.int64),
            np.asarray(timestamps_ms if timestamps_ms is not None else np.full(n, -1), np.int64),
            list(headers) if headers is not None else [None] * n,
        )

    @classmethod
    def empty(cls, topic: str) -> PolledBatch:
        """No messages."""
        return cls.of(topic, [])

    def __len__(self) -> int:
        return len(self.values)

    def slice(self, start: int, stop: int | None = None) -> PolledBatch:
        """Messages ``start`` to ``stop`` (excluded; default: the end): views of the arrays."""
        return PolledBatch(
            self.topic,
            self.values[start:stop],
            self.value_lengths[start:stop],
            self.keys[start:stop],
            self.partitions[start:stop],
            self.offsets[start:stop],
            self.timestamps_ms[start:stop],
            self.headers[start:stop],
        )

    def take(self, rows: Int64Array) -> PolledBatch:
        """Messages ``rows``, in that order."""
        index = rows.tolist()
        values, keys, headers = self.values, self.keys, self.headers
        return PolledBatch(
            self.topic,
            [values[i] for i in index],
            self.value_lengths[rows],
            [keys[i] for i in index],
            self.partitions[rows],
            self.offsets[rows],
            self.timestamps_ms[rows],
            [headers[i] for i in index],
        )

    def where(self, keep: npt.NDArray[np.bool_]) -> PolledBatch:
        """The messages where ``keep`` is true, in order (``self`` when it is true everywhere)."""
        if keep.all():
            return self
        return self.take(np.flatnonzero(keep))

    def in_partitions(self, partitions: set[Partition]) -> npt.NDArray[np.bool_]:
        """bool[M] whether each message belongs to one of ``partitions`` (a lookup table over
        the partition numbers: a few µs, where ``np.isin`` costs ~14 µs a call)."""
        numbers = [p for t, p in partitions if t == self.topic]
        if not numbers:
            return np.zeros(len(self.partitions), dtype=np.bool_)
        top = max(numbers)
        table = np.zeros(top + 1, dtype=np.bool_)
        table[numbers] = True
        mine = self.partitions
        return table[np.minimum(mine, top)] & (mine <= top)

    @classmethod
    def concat(cls, parts: list[PolledBatch]) -> PolledBatch:
        """``parts`` one after another (all of one topic; at least one part)."""
        if len(parts) == 1:
            return parts[0]
        chain = itertools.chain.from_iterable
        return PolledBatch(
            parts[0].topic,
            list(chain(p.values for p in parts)),
            np.concatenate([p.value_lengths for p in parts]),
            list(chain(p.keys for p in parts)),
            np.concatenate([p.partitions for p in parts]),
            np.concatenate([p.offsets for p in parts]),
            np.concatenate([p.timestamps_ms for p in parts]),
            list(chain(p.headers for p in parts)),
        )

    def message(self, i: int) -> ConsumedMessage:
        """Message ``i``, whole (a dead letter's source)."""
        return ConsumedMessage(
            self.topic,
            int(self.partitions[i]),
            int(self.offsets[i]),
            self.keys[i],
            self.values[i],
            self.headers[i],
            int(self.timestamps_ms[i]),
        )
