"""Intake: backlog messages -> decoded columns -> the open batch (source, decode and batch
stages joined, in consumption order).

Messages are decoded a chunk at a time, sized to about what fills the open batch. Events that
do not fit, and every message after them, go back to the head of the backlog for the next
batch. Every message's offset is registered with the commit protocol in consumption order;
rejected messages go to the dead-letter topic with their reason; each accepted event keeps its
source message (a poison event found later is dead-lettered as that message).
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Message

from pipeline.stages.batch import MicroBatcher
from pipeline.stages.columnar import ColumnarDecoder, DecodedBatch
from pipeline.stages.commit import Checkpointer
from pipeline.stages.publish import DeadLetterSink
from pipeline.stages.source import KafkaSource


class Intake:
    """Feeds the open batch from the source's backlog.

    Args:
        source: the backlog (``take``/``unread``).
        decoder: columnar decode and validation.
        batcher: the open batch.
        checkpointer: registers every consumed offset.
        dead_letters: where rejected messages go.
        max_chunk: most messages decoded at once (``batching.consume_batch_size``).
        on_rejected: counts each dead-lettered message (the run summary).

    Example::

        intake = Intake(source, decoder, batcher, checkpointer, dlq, 500, count)
        consumed = intake.feed()
    """

    def __init__(
        self,
        source: KafkaSource,
        decoder: ColumnarDecoder,
        batcher: MicroBatcher,
        checkpointer: Checkpointer,
        dead_letters: DeadLetterSink,
        max_chunk: int,
        on_rejected: Callable[[], None],
    ) -> None:
        self._source = source
        self._decoder = decoder
        self._batcher = batcher
        self._checkpointer = checkpointer
        self._dead_letters = dead_letters
        self._max_chunk = max_chunk
        self._on_rejected = on_rejected
        self._rows_per_event = 8.0  # running mean, sizes the decode chunks

    def feed(self) -> int:
        """Decode backlog messages into the open batch until it is full or the next event does
        not fit.

        Returns:
            How many messages were consumed (accepted or dead-lettered).
        """
        batcher, source = self._batcher, self._source
        consumed = 0
        while not batcher.full and not batcher.holding:
            messages = source.take(self._chunk_size())
            if not messages:
                break
            used = self._admit(messages, self._decoder.decode([m.value() for m in messages]))
            source.unread(messages[used:])
            consumed += used
        return consumed

    def _chunk_size(self) -> int:
        """Messages to decode at once: about what fills the open batch, from the rows per event
        seen so far (what does not fit goes back, and is decoded again next time)."""
        rows_left = max(0, self._batcher.max_rows - self._batcher.rows)
        events = int(rows_left / self._rows_per_event) + 1
        return max(1, min(self._max_chunk, events))

    def _admit(self, messages: list[Message], decoded: DecodedBatch) -> int:
        """Add the decoded events that fit to the open batch and dead-letter the rejects among
        them, registering every offset in order. Returns how many messages were used."""
        batcher, checkpointer = self._batcher, self._checkpointer
        columns = decoded.columns
        if columns.num_events:
            seen = columns.num_rows / columns.num_events
            self._rows_per_event = 0.8 * self._rows_per_event + 0.2 * seen
        fit = batcher.room(columns.candidate_counts)
        accepted = decoded.accepted.tolist()
        used = accepted[fit] if fit < len(accepted) else len(messages)
        rejections = dict(decoded.rejections)
        sources: list[tuple[str, int]] = []
        kept: list[Message] = []
        for i in range(used):
            message = messages[i]
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            assert topic is not None and partition is not None and offset is not None
            checkpointer.consumed(topic, partition, offset)
            rejection = rejections.get(i)
            if rejection is None:
                sources.append((topic, partition))
                kept.append(message)
            else:
                self._dead_letters.publish(message, rejection, checkpointer.open)
                self._on_rejected()
        events = columns.head(fit)
        events.messages = kept
        batcher.add(events, sources)
        if fit < len(accepted):
            batcher.hold()
        return used
