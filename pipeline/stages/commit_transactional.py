"""The exactly-once commit protocol: records and consumed offsets in one Kafka transaction.

:class:`TransactionalCheckpointer` has the interface of
:class:`~pipeline.stages.commit.Checkpointer` (the loop, the sinks and the rebalance handler
use either the same way) and changes *how* sealed checkpoints are committed:

1. The transaction begins before the first record produced for a checkpoint
   (``Checkpoint.before_produce``), so recommendations and dead letters are transactional.
2. At most every ``commit_interval_s`` (and on shutdown or revocation, at once), the offsets of
   the leading sealed checkpoints go into the transaction with ``send_offsets_to_transaction``
   and the consumer's group metadata, and the transaction commits: their records and their
   offsets become visible together, or not at all.
3. A checkpoint cut but not sealed (its forward in flight) has produced nothing yet: its
   records go into the next transaction with its offsets. The open checkpoint's dead letters
   are in the transaction while its offsets are not committable yet (its batch is open), so a
   periodic commit waits until the open checkpoint has produced nothing. A forced commit
   (shutdown, revocation, too many sealed checkpoints) does not wait: after a crash such a
   dead letter may be written again (the output topic is not affected).
4. Any transaction error aborts the transaction and raises
   :class:`~pipeline.stages.commit.DeliveryFailed`: the run stops, and the next run (or
   torchrun's restart) resumes from the committed offsets; a ``read_committed`` reader never
   sees the aborted records. A restart with the same ``transactional.id`` fences its
   predecessor (``init_transactions``); a member whose partitions were taken over is fenced by
   the group generation in its offsets (KIP-447).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from pipeline.config import KafkaSettings, Settings
from pipeline.stages.commit import Checkpoint, Checkpointer, DeliveryFailed

log = logging.getLogger(__name__)


class TransactionalCheckpointer(Checkpointer):
    """Commits sealed checkpoints as Kafka transactions (see the module docstring).

    Args:
        consumer: the input consumer (its ``consumer_group_metadata()`` fences zombies).
        producer: a producer configured with ``transactional.id``.
        commit_interval_s: how long a transaction may span batches.
        max_sealed: sealed checkpoints allowed before :meth:`seal` forces a commit.
        timeout_s: bound of each transactional call.

    Example::

        ckpt = TransactionalCheckpointer(consumer, producer, commit_interval_s=0.1)
        ckpt.consumed("events", 0, 41)
        producer.produce("recs", value, on_delivery=ckpt.delivery_callback())
        ckpt.seal()
        ckpt.commit_ready()  # commits the transaction once 0.1 s have passed
    """

    def __init__(
        self,
        consumer: Any,
        producer: Any,
        commit_interval_s: float,
        max_sealed: int = 4,
        timeout_s: float = 30.0,
    ) -> None:
        self._txn_producer = producer
        self._txn_consumer = consumer
        self._interval_s = commit_interval_s
        self._timeout_s = timeout_s
        self._in_transaction = False
        self._began = 0.0
        super().__init__(consumer, producer, max_sealed)
        producer.init_transactions(timeout_s)
        self.transactions = 0

    def _new_checkpoint(self) -> Checkpoint:
        return Checkpoint(before_produce=self._begin)

    def _begin(self) -> None:
        if not self._in_transaction:
            self._txn_producer.begin_transaction()
            self._in_transaction = True
            self._began = time.monotonic()

    def seal(self, checkpoint: Checkpoint | None = None) -> None:
        """Mark a checkpoint complete (default: cut and seal the open one); more than
        ``max_sealed`` sealed checkpoints commit the transaction at once."""
        if checkpoint is None:
            if not self._open.next_offsets and self._open.pending == 0:
                return
            checkpoint = self.cut()
        checkpoint.sealed = True
        self._txn_producer.poll(0)
        if len(self._sealed) > self._max_sealed:
            self.commit_ready(asynchronous=False)

    def commit_ready(self, asynchronous: bool = True) -> int:
        """Commit the transaction if ``commit_interval_s`` has passed (at once when not
        ``asynchronous``).

        Returns:
            How many checkpoints were committed.

        Raises:
            DeliveryFailed: the transaction failed and was aborted.
        """
        if asynchronous and (
            time.monotonic() - self._began < self._interval_s
            or self._open.pending  # its dead letters' offsets are not committable yet
        ):
            return 0
        leading = 0
        offsets: dict[tuple[str, int], int] = {}
        for checkpoint in self._sealed:
            if not checkpoint.sealed:
                break
            offsets.update(checkpoint.next_offsets)
            leading += 1
        if not offsets and not self._in_transaction:
            return 0
        self._begin()
        self._commit_transaction(offsets)
        for _ in range(leading):
            self._sealed.popleft()
        self.committed.update(offsets)
        self.transactions += 1
        return leading

    def _commit_transaction(self, offsets: dict[tuple[str, int], int]) -> None:
        producer, deadline = self._txn_producer, self.deadline
        timeout_s = self._timeout_s
        if deadline is not None:
            timeout_s = max(0.1, min(timeout_s, deadline - time.monotonic()))
        try:
            if offsets:
                tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
                producer.send_offsets_to_transaction(
                    tps, self._txn_consumer.consumer_group_metadata(), timeout_s
                )
            producer.commit_transaction(timeout_s)
        except KafkaException as exc:
            self._abort(f"transaction commit failed: {exc}")
        self._in_transaction = False
        failed = next((c.error for c in self._sealed if c.sealed and c.error), None)
        if failed is not None:  # cannot happen after a successful commit; guard anyway
            raise DeliveryFailed(failed)

    def _abort(self, reason: str) -> None:
        log.error("%s: aborting the transaction", reason)
        try:
            self._txn_producer.abort_transaction(self._timeout_s)
        except KafkaException as exc:
            log.error("abort failed too: %s", exc)
        self._in_transaction = False
        raise DeliveryFailed(reason)

    def forget(self, partitions: list[tuple[str, int]]) -> None:
        """Partitions were lost: the open transaction holds their records, so it is aborted
        and the run stops (a restart resumes from the committed offsets)."""
        super().forget(partitions)
        if self._in_transaction:
            self._abort(f"partitions {sorted(partitions)} lost mid-transaction")


def transactional_kafka(settings: Settings) -> KafkaSettings:
    """``settings.kafka`` with a ``transactional.id`` on the producer and a ``read_committed``
    consumer (exactly-once).

    Example::

        kafka = transactional_kafka(settings)
        kafka.producer_config()["transactional.id"]  # "streamrank-streamrank-0"
    """
    kafka = settings.kafka
    tid = settings.delivery.transactional_id or (
        f"{kafka.group_id}-{kafka.client_id}-{os.environ.get('RANK', '0')}"
    )
    return kafka.model_copy(
        update={
            "producer_extra": {**kafka.producer_extra, "transactional.id": tid},
            "consumer_extra": {**kafka.consumer_extra, "isolation.level": "read_committed"},
        }
    )
