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
4. Errors are handled by librdkafka's class (``KafkaError.retriable()``,
   ``txn_requires_abort()``, ``fatal()``). A *retriable* one (the coordinator unreachable, a
   call timed out) is retried: librdkafka resumes the call where it stopped, so a broker that
   comes back in time lets the transaction commit. An *abortable* one aborts the transaction,
   and a *fatal* one (the producer was fenced by a newer one with the same
   ``transactional.id``) leaves the producer unusable; both raise
   :class:`~pipeline.types.DeliveryFailed`, as does a retriable error that outlasts the
   call's budget (``timeout_s``, the shutdown deadline): the run stops non-zero, and the next
   run (or torchrun's restart) resumes from the committed offsets; a ``read_committed`` reader
   never sees the aborted records. A transaction left open (the broker unreachable) is aborted
   by its coordinator after ``transaction.timeout.ms``, or when the next run with the same
   ``transactional.id`` fences its predecessor (``init_transactions``); a member whose
   partitions were taken over is fenced by the group generation in its offsets (KIP-447).
5. No Kafka call blocks the loop past its budget: librdkafka's ``send_offsets_to_transaction``
   ignores its timeout while the coordinator is unreachable (it waits for the request's
   ``socket.timeout.ms``, 60 s by default), so every transactional call runs on a helper thread
   while the loop's thread waits in short slices. SIGTERM/SIGINT during such a wait are
   honoured: the stop sets the shutdown deadline at once
   (:class:`~pipeline.types.Shutdown`),
   and the call is given up when it passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from model.rank import RankContext
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.loading import Settings
from pipeline.stages.commit.protocol import Checkpointer
from pipeline.types import Checkpoint, DeliveryFailed, Shutdown

log = logging.getLogger(__name__)


class TransactionalCheckpointer(Checkpointer):
    """Commits sealed checkpoints as Kafka transactions (see the module docstring).

    Args:
        consumer: the input consumer (its ``consumer_group_metadata()`` fences zombies).
        producer: a producer configured with ``transactional.id``.
        commit_interval_s: how long a transaction may span batches.
        max_sealed: sealed checkpoints allowed before :meth:`commit_ready` forces a commit.
        timeout_s: budget of each transactional call, retries of retriable errors included
            (and never past :attr:`deadline`).
        shutdown: once a stop is requested, every call ends by its deadline.
        clock: seconds, monotonic (tests pass a fake).

    Example::

        ckpt = TransactionalCheckpointer(consumer, producer, commit_interval_s=0.1)
        ckpt.consumed("events", partitions, offsets)
        checkpoint = ckpt.cut()
        producer.produce("recs", value, on_delivery=checkpoint.expect_delivery())
        checkpoint.seal()
        ckpt.commit_ready()  # commits the transaction once 0.1 s have passed
    """

    WAIT_SLICE_S = 0.1
    """How often the loop's thread looks up (deadline, signals) while a transactional call
    runs."""
    RETRY_BACKOFF_S = 0.2
    """Pause between attempts of a call that failed with a retriable error (callbacks are
    served meanwhile)."""

    class _GaveUp(Exception):
        """A call did not succeed within its budget (``in_flight``: it still runs)."""

        def __init__(self, what: str, reason: str, in_flight: bool) -> None:
            super().__init__(f"{what}: {reason}")
            self.in_flight = in_flight

    def __init__(
        self,
        consumer: Any,
        producer: Any,
        commit_interval_s: float,
        max_sealed: int = 4,
        timeout_s: float = 30.0,
        shutdown: Shutdown | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._txn_producer = producer
        self._txn_consumer = consumer
        self._interval_s = commit_interval_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._in_transaction = False
        self._began = 0.0
        self._call_end = 0.0
        self._in_flight: str | None = None
        super().__init__(consumer, producer, max_sealed, shutdown=shutdown)
        self.transactions = 0
        """Transactions committed."""
        self.aborts = 0
        """Transactions aborted."""
        try:
            self._call("init_transactions", producer.init_transactions)
        except self._GaveUp as exc:
            raise DeliveryFailed(f"could not initialise transactions: {exc}") from exc
        except KafkaException as exc:
            raise DeliveryFailed(f"could not initialise transactions: {exc}") from exc

    def _new_checkpoint(self) -> Checkpoint:
        return Checkpoint(before_produce=self._begin)

    def _begin(self) -> None:
        if not self._in_transaction:
            self._txn_producer.begin_transaction()
            self._in_transaction = True
            self._began = self._clock()

    def commit_ready(self) -> int:
        """Commit the transaction if ``commit_interval_s`` has passed, or at once when more than
        ``max_sealed`` sealed checkpoints wait.

        Returns:
            How many checkpoints were committed.

        Raises:
            DeliveryFailed: the transaction failed (aborted, or left to its coordinator).
        """
        self._txn_producer.poll(0)
        return self._commit_done(asynchronous=self._waiting() <= self._max_sealed)

    def _commit_done(self, asynchronous: bool) -> int:
        """Commit the leading sealed checkpoints in one transaction (when ``asynchronous``,
        only once ``commit_interval_s`` has passed and the open checkpoint produced nothing)."""
        if asynchronous and (
            self._clock() - self._began < self._interval_s
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
        producer = self._txn_producer
        tps = [TopicPartition(t, p, o) for (t, p), o in offsets.items()]
        try:
            if tps:
                # Asked here, on the consumer's own thread: confluent-kafka serialises calls
                # on a client, so from the helper thread this would wait for a consume() in
                # progress (this commit may run inside its rebalance callback).
                group = self._txn_consumer.consumer_group_metadata()
                self._call(
                    "send_offsets_to_transaction",
                    lambda timeout_s: producer.send_offsets_to_transaction(tps, group, timeout_s),
                )
            self._call("commit_transaction", producer.commit_transaction)
        except self._GaveUp as exc:
            self._in_transaction = False
            raise DeliveryFailed(
                f"transaction not committed ({exc}); its records are left to be aborted by "
                "the coordinator (transaction.timeout.ms) or by the next run's fencing"
            ) from exc
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, KafkaError) and err.fatal():
                self._in_transaction = False
                raise DeliveryFailed(f"transaction failed, producer unusable: {err}") from exc
            self._abort(f"transaction commit failed: {err}")
        self._in_transaction = False
        failed = next((c.error for c in self._checkpoints if c.sealed and c.error), None)
        if failed is not None:  # cannot happen after a successful commit; guard anyway
            raise DeliveryFailed(failed)

    def _abort(self, reason: str) -> None:
        log.error("%s: aborting the transaction", reason)
        try:
            self._call("abort_transaction", self._txn_producer.abort_transaction)
            self.aborts += 1
        except (KafkaException, self._GaveUp) as exc:
            log.error("abort failed too (the coordinator aborts it in the end): %s", exc)
        self._in_transaction = False
        raise DeliveryFailed(reason)

    def _call(self, what: str, call: Callable[[float], object]) -> None:
        """Run one transactional call until it succeeds, retrying retriable errors.

        Raises:
            KafkaException: an abortable, fatal or unclassified error.
            :class:`_GaveUp`: retriable errors, or a call still running, past the call's budget.
        """
        if self._in_flight is not None:
            raise self._GaveUp(what, f"{self._in_flight} still in progress", in_flight=True)
        self._call_end = self._clock() + self._timeout_s
        while True:
            try:
                self._attempt(what, call)
                return
            except KafkaException as exc:
                err = exc.args[0]
                if not isinstance(err, KafkaError) or not err.retriable():
                    raise
                if err.fatal() or err.txn_requires_abort():
                    raise
                if self._clock() >= self._end():
                    raise self._GaveUp(what, str(err), in_flight=False) from exc
                log.warning("%s: %s (retriable): retrying", what, err)
                self._txn_producer.poll(self.RETRY_BACKOFF_S)

    def _end(self) -> float:
        """When the call in progress must give up: its budget, or the shutdown deadline (set
        the moment a stop is requested, e.g. by SIGTERM)."""
        deadline = self.deadline
        return self._call_end if deadline is None else min(self._call_end, deadline)

    def _attempt(self, what: str, call: Callable[[float], object]) -> None:
        """One call on a helper thread; the loop's thread waits in slices until it returns
        or the call's end passes (then the call is left running: :class:`_GaveUp`)."""
        outcome: list[BaseException | None] = []
        done = threading.Event()
        timeout_s = max(0.1, min(self._timeout_s, self._end() - self._clock()))

        def run() -> None:
            try:
                call(timeout_s)
                outcome.append(None)
            except BaseException as exc:  # handed to the waiting thread
                outcome.append(exc)
            finally:
                self._in_flight = None
                done.set()

        self._in_flight = what
        threading.Thread(target=run, name=f"txn-{what}", daemon=True).start()
        while not done.wait(self.WAIT_SLICE_S):
            if self._clock() >= self._end():
                raise self._GaveUp(what, "no answer from the broker", in_flight=True)
        if outcome[0] is not None:
            raise outcome[0]

    def forget(self, partitions: list[tuple[str, int]]) -> None:
        """Partitions were lost: the open transaction holds their records, so it is aborted
        and the run stops (a restart resumes from the committed offsets)."""
        super().forget(partitions)
        if self._in_transaction:
            self._abort(f"partitions {sorted(partitions)} lost mid-transaction")


def transactional_kafka(settings: Settings, rank: RankContext) -> KafkaSettings:
    """``settings.kafka`` with a ``transactional.id`` on the producer and a ``read_committed``
    consumer with an eager partition assignment (exactly-once).

    Eager (``roundrobin``, unless ``consumer_extra`` names a strategy): a member revokes all its
    partitions, committing its transaction, *before* it rejoins the group, so its transactions
    always carry the group's current generation. With the cooperative protocol a member rejoins
    while it keeps scoring, and a transaction committed meanwhile carries a generation the
    group has left: the broker rejects its offsets (``ILLEGAL_GENERATION``, KIP-447) and the
    transaction must be aborted, at every rebalance.

    Example::

        kafka = transactional_kafka(settings, RankContext.from_env())
        kafka.producer_config()["transactional.id"]  # "streamrank-streamrank-0"
    """
    kafka = settings.kafka
    tid = settings.delivery.transactional_id or (f"{kafka.group_id}-{kafka.client_id}-{rank.rank}")
    consumer_extra = {
        "partition.assignment.strategy": "roundrobin",
        **kafka.consumer_extra,
        "isolation.level": "read_committed",
    }
    return kafka.model_copy(
        update={
            "producer_extra": {**kafka.producer_extra, "transactional.id": tid},
            "consumer_extra": consumer_extra,
        }
    )
