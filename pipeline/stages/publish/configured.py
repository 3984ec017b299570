"""Records of an output schema of the user's (``[output]``), written by the compiled writer
(:mod:`pipeline.connectors.avro.writer`) from the program made of the schema and its role map
(:mod:`pipeline.connectors.avro.write_program`): one call per batch, columns in, bytes out.

Example::

    encoder = SchemaEncoder(header, program)
    values = encoder.encode(events, scored, flags, now_ms)
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipeline.connectors.avro.write_program import (
    SCORE_F4,
    SCORE_F8,
    TASK_F4,
    TASK_F8,
    WriteProgram,
)
from pipeline.connectors.avro.writer import OutputColumns, write_records
from pipeline.stages.publish.flags import FALLBACK_NAMES, FALLBACK_OFFSETS, FallbackFlags
from pipeline.stages.publish.recommendation import split_records
from pipeline.types import EventColumns, ScoredBatch

__all__ = ["SchemaEncoder"]

_NO_BYTES = np.zeros(0, dtype=np.uint8)


def _bytes(values: npt.NDArray[np.floating], dtype: str) -> npt.NDArray[np.uint8]:
    """``values`` as little-endian ``dtype`` bytes, flat."""
    return np.ascontiguousarray(values, dtype=dtype).view(np.uint8).reshape(-1)


class SchemaEncoder:
    """One record of the user's output schema per event.

    Args:
        header: what precedes each Avro body (the Confluent header of the registered output
            schema, or nothing in raw framing).
        program: the output schema and its roles, compiled.
    """

    def __init__(self, header: bytes, program: WriteProgram) -> None:
        self._header = np.frombuffer(header, dtype=np.uint8)
        self.program = program
        ops = program.ops
        tasks = ops[np.isin(ops[:, 0], [TASK_F8, TASK_F4]), 1]
        self.task_columns = int(tasks.max()) + 1 if len(tasks) else 0
        """The task score columns the program reads (``ScoredBatch.task_scores``' width)."""
        self._widths = tuple(program.writes(op) for op in (SCORE_F8, SCORE_F4, TASK_F8, TASK_F4))
        """Which score bytes the program copies: ranking scores, task scores; 8 or 4 bytes."""
        echoes = program.echo_columns
        self.raw_columns = max(echoes) + 1 if echoes else 0
        """The raw event fields the program reads (``FieldColumns.raw_*``' width)."""

    def encode(
        self, events: EventColumns, scored: ScoredBatch, flags: FallbackFlags, now_ms: int
    ) -> list[bytes]:
        """The record of every event
        (:meth:`~pipeline.stages.publish.sink.RecordEncoder.encode`).

        Raises:
            ValueError: the batch lacks the task scores or the event fields the schema writes.
        """
        program = self.program
        tasks = scored.task_scores
        if self.task_columns and (tasks is None or tasks.shape[1] < self.task_columns):
            raise ValueError(
                f"the output writes {self.task_columns} task score column(s); the scorer gave "
                f"{0 if tasks is None else tasks.shape[1]}"
            )
        raw = events.fields
        if self.raw_columns and (raw is None or raw.raw_counts.shape[1] < self.raw_columns):
            raise ValueError(f"the output echoes {self.raw_columns} event field(s) not decoded")
        if tasks is None:
            tasks = np.zeros((len(scored.item_ids), 0), dtype=np.float32)
        n = events.num_events
        columns = OutputColumns(
            header=self._header,
            event_ids=events.event_id_bytes,
            event_id_offsets=events.event_id_offsets,
            user_ids=events.user_ids.astype(np.int64, copy=False),
            event_time_ms=events.event_time_ms.astype(np.int64, copy=False),
            retrieved=events.retrieved.astype(bool, copy=False),
            item_counts=scored.counts.astype(np.int64, copy=False),
            item_ids=scored.item_ids.astype(np.int64, copy=False),
            scores8=_bytes(scored.scores, "<f8") if self._widths[0] else _NO_BYTES,
            scores4=_bytes(scored.scores, "<f4") if self._widths[1] else _NO_BYTES,
            tasks8=_bytes(tasks, "<f8") if self._widths[2] else _NO_BYTES,
            tasks4=_bytes(tasks, "<f4") if self._widths[3] else _NO_BYTES,
            tasks=int(tasks.shape[1]),
            model_version=np.frombuffer(scored.model_version.encode(), dtype=np.uint8),
            scored_at=now_ms,
            fallback_user=flags.user.astype(bool, copy=False),
            fallback_item=flags.item.astype(bool, copy=False),
            names=FALLBACK_NAMES,
            name_offsets=FALLBACK_OFFSETS,
            raw_bytes=raw.raw_bytes if raw is not None else _NO_BYTES,
            raw_counts=raw.raw_counts if raw is not None else np.zeros((n, 0), np.int64),
            raw_present=raw.raw_present if raw is not None else np.zeros((n, 0), np.uint8),
        )
        return split_records(*write_records(program, columns))
