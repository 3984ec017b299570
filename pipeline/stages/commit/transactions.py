"""The exactly-once commit protocol: records and consumed offsets in one Kafka transaction.

:class:`TransactionalCheckpointer` is the :class:`~.protocol.Checkpointer` with
``delivery.guarantee = "exactly_once"`` (the loop, the sinks and the rebalance handler use either
the same way); it changes *how* sealed checkpoints are committed:

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
   :class:`~pipeline.records.DeliveryFailed`: the run stops, and the next run (or
   torchrun's restart) resumes from the committed offsets; a ``read_committed`` reader never
   sees the aborted records. A restart with the same ``transactional.id`` fences its
   predecessor (``init_transactions``); a member whose partitions were taken over is fenced by
   the group generation in its offsets (KIP-447).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from model.rank import RankContext
from pipeline.config import KafkaSettings, Settings
from pipeline.records import Checkpoint, DeliveryFailed
from pipeline.shutdown import Shutdown
from pipeline.stages.commit.protocol import Checkpointer

log = logging.getLogger(__name__)


class TransactionalCheckpointer(Checkpointer):
    """Commits sealed checkpoints as Kafka transactions (see the module docstring).

    Args:
        consumer: the input consumer (its ``consumer_group_metadata()`` fences zombies).
        producer: a producer configured with ``transactional.id``.
        commit_interval_s: how long a transaction may span batches.
        max_sealed: sealed checkpoints allowed before :meth:`commit_ready` forces a commit.
        timeout_s: bound of each transactional call.
        shutdown: once a stop is requested, every call ends by its deadline.

    Example::

        ckpt = TransactionalCheckpointer(consumer, producer, commit_interval_s=0.1)
        ckpt.consumed("events", partitions, offsets)
        checkpoint = ckpt.cut()
        producer.produce("recs", value, on_delivery=checkpoint.expect_delivery())
        checkpoint.seal()
        ckpt.commit_ready()  # commits the transaction once 0.1 s have passed
    """

    def __init__(
        self,
        consumer: Any,
        producer: Any,
        commit_interval_s: float,
        max_sealed: int = 4,
        timeout_s: float = 30.0,
        shutdown: Shutdown | None = None,
    ) -> None:
        self._txn_producer = producer
        self._txn_consumer = consumer
        self._interval_s = commit_interval_s
        self._timeout_s = timeout_s
        self._in_transaction = False
        self._began = 0.0
        super().__init__(consumer, producer, max_sealed, shutdown=shutdown)
        producer.init_transactions(timeout_s)
        self.transactions = 0

    def _new_checkpoint(self) -> Checkpoint:
        return Checkpoint(before_produce=self._begin)

    def _begin(self) -> None:
        if not self._in_transaction:
            self._txn_producer.begin_transaction()
            self._in_transaction = True
            self._began = time.monotonic()

    def commit_ready(self) -> int:
        """Commit the transaction if ``commit_interval_s`` has passed, or at once when more than
        ``max_sealed`` sealed checkpoints wait.

        Returns:
            How many checkpoints were committed.

        Raises:
            DeliveryFailed: the transaction failed and was aborted.
        """
        self._txn_producer.poll(0)
        return self._commit_done(asynchronous=self._waiting() <= self._max_sealed)

    def _commit_done(self, asynchronous: bool) -> int:
        """Commit the leading sealed checkpoints in one transaction (when ``asynchronous``,
        only once ``commit_interval_s`` has passed and the open checkpoint produced nothing)."""
        if asynchronous and (
            time.monotonic() - self._began < self._interval_s
            or self._open.pending  # its dead letters' offsets are not committable yet
        ):
            return 0
        leading = 0
        offsets: dict[tuple[str, int], int] = {}
        for checkpoint in self._checkpoints:
            if not checkpoint.sealed:
                break
            offsets.update(checkpoint.next_offsets)
            leading += 1
        if not offsets and not self._in_transaction:
            return 0
        self._begin()
        self._commit_transaction(offsets)
        for _ in range(leading):
            self._checkpoints.popleft()
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
        failed = next((c.error for c in self._checkpoints if c.sealed and c.error), None)
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


def transactional_kafka(settings: Settings, rank: RankContext) -> KafkaSettings:
    """``settings.kafka`` with a ``transactional.id`` on the producer and a ``read_committed``
    consumer (exactly-once).

    Example::

        kafka = transactional_kafka(settings, RankContext.from_env())
        kafka.producer_config()["transactional.id"]  # "streamrank-streamrank-0"
    """
    kafka = settings.kafka
    tid = settings.delivery.transactional_id or (f"{kafka.group_id}-{kafka.client_id}-{rank.rank}")
    return kafka.model_copy(
        update={
            "producer_extra": {**kafka.producer_extra, "transactional.id": tid},
            "consumer_extra": {**kafka.consumer_extra, "isolation.level": "read_committed"},
        }
    )
