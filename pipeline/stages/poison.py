"""Poison handling in the loop: a batch that fails after decode is bisected
(:func:`pipeline.stages.isolate.bisect`), the events that fail alone are dead-lettered with
reason ``processing_error``, and the rest are scored."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from pipeline.stages.batch import EventColumns
from pipeline.stages.commit import Checkpoint, Checkpointer
from pipeline.stages.decode import RejectedMessage, RejectReason
from pipeline.stages.isolate import bisect
from pipeline.stages.publish import DeadLetterSink
from pipeline.stages.score import ForwardExecutor, PreparedBatch

log = logging.getLogger(__name__)


PrepareStep = Callable[[EventColumns, Checkpoint], PreparedBatch]
"""Enrich and featurise events (the steps before the forward)."""
ProcessStep = Callable[[EventColumns, Checkpoint], None]
"""The whole chain for events: prepare, forward, top-K, publish (synchronously)."""


class PoisonIsolator:
    """What the loop does when a batch fails after decode: bisect, dead-letter, go on.

    Args:
        prepare: the steps before the forward.
        process: the whole chain, synchronously on the loop's thread (single process).
        dead_letters: where a poison event goes (its source message, untouched).
        checkpointer: seals the batch's checkpoint once its events are all accounted for.
        executor: the forward executor (its in-flight batch is published first).
        collective: ranks of a sharded model (forwards only together).
        on_dead_letter: counts each dead-lettered event (the run summary).

    Example::

        isolator = PoisonIsolator(prepare, process, dlq, checkpointer, executor, False, count)
        isolator.before_forward(events, checkpoint, error, pad_rows=None)
    """

    def __init__(
        self,
        prepare: PrepareStep,
        process: ProcessStep,
        dead_letters: DeadLetterSink,
        checkpointer: Checkpointer,
        executor: ForwardExecutor,
        collective: bool,
        on_dead_letter: Callable[[], None],
    ) -> None:
        self._prepare = prepare
        self._process = process
        self._dead_letters = dead_letters
        self._checkpointer = checkpointer
        self._executor = executor
        self._collective = collective
        self._on_dead_letter = on_dead_letter

    def before_forward(
        self,
        events: EventColumns,
        checkpoint: Checkpoint,
        error: Exception,
        pad_rows: int | None,
    ) -> None:
        """A batch failed before its forward: dead-letter the events that fail alone.

        A single process scores the rest now. Ranks of a sharded model bisect only the local
        steps before the forward (no collective is involved), then join the agreed forward
        with the good events (or with padding when none is left): every rank still runs
        exactly one forward for the step.
        """
        log.warning("batch of %d events failed (%s): isolating", events.num_events, error)
        self._executor.finish()  # the previous batch is published first
        if not self._collective:
            self.whole_chain(events, checkpoint, error)
            return
        found = bisect(
            list(range(events.num_events)),
            lambda group: self._prepare(_take(events, group), checkpoint),
            error,
        )
        self._dead_letter(events, found.failed, checkpoint)
        good = found.good_items
        if good:
            self._executor.submit(self._prepare(_take(events, good), checkpoint), pad_rows)
        else:
            self._checkpointer.seal(checkpoint)
            if pad_rows:
                self._executor.submit_padding(pad_rows)

    def after_forward(self, batch: PreparedBatch, error: Exception) -> None:
        """The forward, top-K or publish of ``batch`` failed (single process): isolate."""
        log.warning("batch of %d events failed (%s): isolating", batch.events.num_events, error)
        self.whole_chain(batch.events, batch.checkpoint, error)

    def whole_chain(self, events: EventColumns, checkpoint: Checkpoint, error: Exception) -> None:
        """Bisect the whole chain synchronously (enrich to publish) on the loop's thread."""
        found = bisect(
            list(range(events.num_events)),
            lambda group: self._process(_take(events, group), checkpoint),
            error,
        )
        self._dead_letter(events, found.failed, checkpoint)
        self._checkpointer.seal(checkpoint)

    def _dead_letter(
        self, events: EventColumns, failed: list[tuple[int, Exception]], checkpoint: Checkpoint
    ) -> None:
        for index, exc in failed:
            rejection = RejectedMessage(
                RejectReason.PROCESSING_ERROR, f"{type(exc).__name__}: {exc}"
            )
            self._dead_letters.publish(events.messages[index], rejection, checkpoint)
            self._on_dead_letter()


def _take(events: EventColumns, group: list[int]) -> EventColumns:
    return events.take(np.asarray(group, dtype=np.int64))
