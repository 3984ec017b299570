"""The ``[batching]`` section: dynamic micro-batching and ingest workers."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from pipeline.settings.section import Section


class BatchingSettings(Section):
    """Dynamic micro-batching (:mod:`pipeline.runtime.batch_policy`): a batch is scored as soon
    as the scorer is free and the batch holds enough rows to leave the loop headroom, and at the
    latest at ``max_batch_rows``, ``max_delay_ms`` of holding or when the latency budget would
    be exceeded."""

    max_batch_rows: int = 4096
    """Rows are (event x candidate) pairs; an event is never split across batches."""
    max_delay_ms: float = 20.0
    """Longest a free scorer holds a batch open for more events, from when the scorer became free
    or the batch's first event arrived, whichever is later (a quiet loop holds it one batch's
    fixed cost; a busy one until it has the rows that leave the loop headroom); with a forward
    in flight, the longest the batch's first event waits for it."""
    latency_budget_ms: float = 100.0
    """A batch's oldest event's wait plus the batch's estimated processing time (enrich to
    publish, learnt online) stays within this: the batch is scored, or cut, before it would not.
    A batch's estimated processing alone is at most half of it, and holding a batch for
    headroom stops at half of it. A cut never makes a batch so small that its fixed cost is
    more than a fifth of it (when that is all that still fits, the batch is cut at half of
    the budget instead: the input is behind)."""
    consume_batch_size: int = 500
    """Messages asked from Kafka per poll."""
    max_in_flight_batches: int = 4
    """Batches produced but not yet acknowledged by the broker before the loop waits for acks
    (without pausing the input)."""
    overlap_forward: bool | None = None
    """Run each batch's forward on a scoring thread while the loop consumes the next batch.
    ``"auto"`` (read as ``None``, the default): on when the model runs on a GPU; off on CPU,
    where the loop's work and the forward's threads compete for the same cores (measured slower
    on 2 cores: BENCHMARKS.md)."""
    ingest_workers: int = 0
    """Processes per rank that consume, decode, enrich and build the model input, each a member
    of the consumer group with its own commits, while the rank's process only scores their
    batches (:mod:`pipeline.ingest`). 0: one process does everything."""

    @property
    def warm_up_rows(self) -> tuple[int, ...]:
        """The batch sizes the scorer is warmed up at before the first batch: ``max_batch_rows``
        and half of it (two sizes let ``torch.compile`` settle on dynamic shapes). Read by the
        loop's scoring stage and by a rank's scoring server for its ingest workers."""
        return (self.max_batch_rows, max(1, self.max_batch_rows // 2))

    @field_validator("overlap_forward", mode="before")
    @classmethod
    def _auto(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return None
        return value

    @field_validator("ingest_workers")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must be >= 0")
        return value

    @field_validator("latency_budget_ms")
    @classmethod
    def _budget(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be > 0")
        return value

    @field_validator("max_batch_rows", "consume_batch_size", "max_in_flight_batches")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be >= 1")
        return value
