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
4. Errors are handled by librdkafka's class (``retriable``, ``txn_requires_abort``, ``fatal`` of
   :class:`~pipeline.connectors.kafka.errors.KafkaClientError`), as Kafka Streams does. A
   *retriable* one (the coordinator unreachable, a call timed out) is retried, the same call again:
   librdkafka resumes it where it stopped, so a broker that comes back in time lets the transaction
   commit. An *abortable* one, a retriable one that outlasts the transaction's budget
   (``timeout_s``: ``transaction.timeout.ms``, after which the coordinator aborts it anyway), or
   partitions lost while it is open, make the transaction fail (:class:`TransactionFailed`): the
   loop then aborts it (:meth:`abort`, once any call still in flight has returned), drops what it
   had not committed, goes back to the offsets last committed and goes on
   (:meth:`pipeline.runtime.drain.Drain.rewind`); a ``read_committed`` reader never sees the aborted
   records. Only a *fatal* error (the producer was fenced by a newer one with the same
   ``transactional.id``), or the shutdown deadline passing first, ends the run:
   :class:`~pipeline.types.DeliveryFailed`, exit non-zero, and the next run (or torchrun's restart)
   resumes from the committed offsets. A transaction left open by a run that died is aborted by its
   coordinator after ``transaction.timeout.ms``, or when the next run with the same
   ``transactional.id`` fences its predecessor (``init_transactions``); a member whose partitions
   were taken over is fenced by the group generation in its offsets (KIP-447).
5. No Kafka call blocks the loop past its budget (:mod:`.calls`: each call on a helper thread,
   the loop's thread waiting in short slices; SIGTERM/SIGINT during such a wait set the
   shutdown deadline at once, :class:`~pipeline.types.Shutdown`, and the call is given up when
   it passes). A call that never comes back (librdkafka's ``send_offsets_to_transaction`` may
   not, after a broker restart) cannot be followed by an abort on its producer: the producer is
   replaced by a new one with the same ``transactional.id`` (given a way to make one,
   ``renew``), whose ``init_transactions`` fences the old one, and its coordinator aborts the
   transaction the old one left open.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from model.rank import RankContext
from pipeline.connectors.kafka.consumer import InputConsumer
from pipeline.connectors.kafka.errors import KafkaClientError
from pipeline.connectors.kafka.producer import OutputProducer
from pipeline.settings.kafka import KafkaClientConfig, KafkaSettings
from pipeline.settings.loading import Settings
from pipeline.stages.commit.calls import GaveUp, TransactionCalls
from pipeline.stages.commit.protocol import Checkpointer
from pipeline.types import Checkpoint, DeliveryFailed, Shutdown

log = logging.getLogger(__name__)

TRANSACTION_TIMEOUT_S = 60.0
"""librdkafka's default ``transaction.timeout.ms``, in seconds."""


class TransactionFailed(DeliveryFailed):
    """The open transaction cannot be committed: it is to be aborted, and the loop goes back to
    the offsets last committed (:meth:`TransactionalCheckpointer.abort`)."""


def transaction_budget_s(kafka: KafkaClientConfig) -> float:
    """How long a transaction may take: the producer's ``transaction.timeout.ms`` (after it
    the coordinator aborts the transaction anyway).

    Args:
        kafka: the clients' configuration (``KafkaSettings.config`` of
            :func:`transactional_kafka`'s settings): the producer's, as librdkafka gets it.

    Example::

        transaction_budget_s(transactional_kafka(settings, rank).config)  # 60.0 by default
    """
    configured = kafka.producer.get("transaction.timeout.ms")
    return float(str(configured)) / 1000 if configured is not None else TRANSACTION_TIMEOUT_S


class TransactionalCheckpointer(Checkpointer):
    """Commits sealed checkpoints as Kafka transactions (see the module docstring).

    Args:
        consumer: the input consumer (its ``consumer_group_metadata()`` fences zombies).
        producer: a producer configured with ``transactional.id``.
        commit_interval_s: how long a transaction may span batches.
        max_sealed: sealed checkpoints allowed before :meth:`commit_ready` forces a commit.
        timeout_s: the transaction's budget: how long each transactional call may take,
            retries of retriable errors included (and never past :attr:`deadline`);
            :func:`transaction_budget_s`.
        shutdown: once a stop is requested, every call ends by its deadline.
        clock: seconds, monotonic (tests pass a fake).
        renew: makes a new producer with the same configuration (to replace one whose call
            never came back); ``None``: wait for such a call instead.

    Example::

        ckpt = TransactionalCheckpointer(consumer, producer, commit_interval_s=0.1)
        ckpt.consumed("events", partitions, offsets)
        checkpoint = ckpt.cut()
        checkpoint.expect(1)                    # begins the transaction
        producer.send("recs", [value], [key], checkpoint)
        checkpoint.seal()
        ckpt.commit_ready()  # commits the transaction once 0.1 s have passed
    """

    def __init__(
        self,
        consumer: InputConsumer,
        producer: OutputProducer,
        commit_interval_s: float,
        max_sealed: int = 4,
        timeout_s: float = TRANSACTION_TIMEOUT_S,
        shutdown: Shutdown | None = None,
        clock: Callable[[], float] = time.monotonic,
        renew: Callable[[], OutputProducer] | None = None,
    ) -> None:
        self._txn_consumer = consumer
        self._interval_s = commit_interval_s
        self._clock = clock
        self._renew = renew
        self._in_transaction = False
        self._began = 0.0
        self._failure: str | None = None
        """Why the open transaction cannot be committed (until :meth:`abort`)."""
        self._abandoned: list[OutputProducer] = []
        """Producers replaced while a call of theirs still ran (kept: never destroyed under
        it)."""
        super().__init__(consumer, producer, max_sealed, shutdown=shutdown)
        self._calls = TransactionCalls(producer, timeout_s, lambda: self.deadline, clock)
        self.transactions = 0
        """Transactions committed."""
        self.aborts = 0
        """Transactions aborted."""
        self._init_transactions()

    @property
    def producer(self) -> OutputProducer:
        """The transactional producer serving now (a new one after :meth:`abort` may have
        replaced it)."""
        return self._calls.producer

    def _init_transactions(self) -> None:
        try:
            self._calls.call("init_transactions", self.producer.init_transactions)
        except (GaveUp, KafkaClientError) as exc:
            raise DeliveryFailed(f"could not initialise transactions: {exc}") from exc

    def _new_checkpoint(self) -> Checkpoint:
        return Checkpoint(before_produce=self._begin)

    def _begin(self) -> None:
        if not self._in_transaction:
            self.producer.begin_transaction()
            self._in_transaction = True
            self._began = self._clock()

    def commit_ready(self) -> int:
        """Commit the transaction if ``commit_interval_s`` has passed, or at once when more than
        ``max_sealed`` sealed checkpoints wait.

        Returns:
            How many checkpoints were committed.

        Raises:
            TransactionFailed: the transaction cannot be committed (to abort, then rewind).
            DeliveryFailed: the producer is unusable, or the shutdown deadline passed.
        """
        self.producer.poll(0)
        return self._commit_done(asynchronous=self._waiting() <= self._max_sealed)

    def _commit_done(self, asynchronous: bool) -> int:
        """Commit the leading sealed checkpoints in one transaction (when ``asynchronous``,
        only once ``commit_interval_s`` has passed and the open checkpoint produced nothing)."""
        if self._failure is not None:
            raise TransactionFailed(self._failure)
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
        self._advance(offsets)
        self.transactions += 1
        return leading

    def flush_and_send(self, timeout_s: float = 30.0) -> None:
        """A transaction is committed synchronously (its calls have their own budget, on a
        helper thread): :meth:`flush_and_commit`."""
        self.flush_and_commit(timeout_s)

    def send_again(self) -> None:
        """Commit what is sealed in one transaction, synchronously."""
        self._commit_done(asynchronous=False)

    def _commit_transaction(self, offsets: dict[tuple[str, int], int]) -> None:
        producer = self.producer
        try:
            if offsets:
                # Asked here, on the consumer's own thread: confluent-kafka serialises calls
                # on a client, so from the helper thread this would wait for a consume() in
                # progress (this commit may run inside its rebalance callback).
                group = self._txn_consumer.group_metadata()
                self._calls.call(
                    "send_offsets_to_transaction",
                    lambda timeout_s: producer.send_offsets_to_transaction(
                        offsets, group, timeout_s
                    ),
                )
            self._calls.call("commit_transaction", producer.commit_transaction)
        except GaveUp as exc:
            if self._calls.past_deadline():
                raise DeliveryFailed(
                    f"transaction not committed ({exc}); its records are left to be aborted "
                    "by the coordinator (transaction.timeout.ms) or by the next run's fencing"
                ) from exc
            raise self._fail(f"transaction not committed within its budget ({exc})") from exc
        except KafkaClientError as err:
            if err.fatal:
                self._in_transaction = False
                raise DeliveryFailed(f"transaction failed, producer unusable: {err}") from err
            raise self._fail(f"transaction commit failed: {err}") from err
        self._in_transaction = False
        failed = next((c.error for c in self._checkpoints if c.sealed and c.error), None)
        if failed is not None:  # cannot happen after a successful commit; guard anyway
            raise DeliveryFailed(failed)

    def _fail(self, reason: str) -> TransactionFailed:
        """The open transaction cannot be committed any more: :meth:`abort` is next."""
        log.warning("%s: the transaction is to be aborted", reason)
        self._failure = reason
        return TransactionFailed(reason)

    def abort(self) -> dict[tuple[str, int], int]:
        """Abort the open transaction, never while a transactional call is in flight (one that
        does not come back: its producer is replaced, which fences it and makes the
        coordinator abort), and drop every checkpoint not committed
        (:meth:`Checkpointer.abort`). Deliveries purged by the abort fail nobody.

        Returns:
            Per partition, the offset to go back to (the last committed one, tracked here: the
            coordinator may be down).

        Raises:
            DeliveryFailed: the producer is unusable, or the shutdown deadline passed first.
        """
        reason = self._failure or "another member's transaction failed"
        left = self.uncommitted_events()
        if self._in_transaction:
            if self._renew is not None and not self._calls.wait(limit_s=0.0):
                self._replace_producer()
            else:
                self._abort_transaction()
            self.aborts += 1
        self._in_transaction, self._failure = False, None
        log.error(
            "transaction aborted (%s): the outputs of %d consumed events are dropped; going "
            "back to the last committed offsets",
            reason,
            left,
        )
        return super().abort()

    def _abort_transaction(self) -> None:
        """``abort_transaction`` once no call is in flight, until it succeeds."""
        while True:
            self._calls.wait()
            try:
                self._calls.call("abort_transaction", self.producer.abort_transaction)
                return
            except GaveUp as exc:
                if self._calls.past_deadline():
                    raise DeliveryFailed(f"transaction not aborted: {exc}") from exc
                log.warning("%s: trying again", exc)
            except KafkaClientError as err:
                what = "producer unusable" if err.fatal else "abort_transaction failed"
                raise DeliveryFailed(f"{what}: {err}") from err

    def _replace_producer(self) -> None:
        """A new producer with the same ``transactional.id``, whose ``init_transactions`` fences
        the old one (its call still in flight is abandoned; the coordinator aborts its open
        transaction)."""
        assert self._renew is not None
        log.warning("%s never came back: replacing the producer", self._calls.in_flight)
        self._abandoned.append(self._calls.producer)
        fresh = self._renew()
        self._calls.renewed(fresh)
        self._producer = fresh
        while True:
            try:
                self._calls.call("init_transactions", fresh.init_transactions)
                return
            except GaveUp as exc:
                if self._calls.past_deadline():
                    raise DeliveryFailed(f"no new producer: {exc}") from exc
                log.warning("%s: trying again", exc)
                self._calls.wait()
            except KafkaClientError as exc:
                raise DeliveryFailed(f"no new producer: {exc}") from exc

    def forget(self, partitions: list[tuple[str, int]]) -> None:
        """Partitions were lost: the open transaction holds their records, so it fails (the
        loop aborts it and goes back to the last committed offsets).

        Raises:
            TransactionFailed: a transaction was open.
        """
        super().forget(partitions)
        if self._in_transaction:
            raise self._fail(f"partitions {sorted(partitions)} lost mid-transaction")


def transactional_id(settings: Settings, rank: RankContext) -> str:
    """This member's ``transactional.id`` (exactly-once): ``delivery.transactional_id``, else
    ``<kafka.group_id>-<kafka.client_id>-<RANK>``; stable across restarts, so a restarted
    member fences its predecessor's open transaction.

    Example::

        transactional_id(settings, RankContext(rank=1))  # "streamrank-streamrank-1"
    """
    kafka = settings.kafka
    return settings.delivery.transactional_id or f"{kafka.group_id}-{kafka.client_id}-{rank.rank}"


def transactional_kafka(settings: Settings, rank: RankContext) -> KafkaSettings:
    """``settings.kafka`` with a ``transactional.id`` on the producer and a ``read_committed``
    consumer with an eager partition assignment (exactly-once); its ``config`` is built once
    for them (the clients and the transaction's budget are taken from it).

    Eager (``roundrobin``, unless ``consumer_extra`` names a strategy): a member revokes all its
    partitions, committing its transaction, *before* it rejoins the group, so its transactions
    always carry the group's current generation. With the cooperative protocol a member rejoins
    while it keeps scoring, and a transaction committed meanwhile carries a generation the
    group has left: the broker rejects its offsets (``ILLEGAL_GENERATION``, KIP-447) and the
    transaction must be aborted, at every rebalance.

    Example::

        kafka = transactional_kafka(settings, RankContext.from_env())
        kafka.config.producer["transactional.id"]  # "streamrank-streamrank-0"
    """
    kafka = settings.kafka
    tid = transactional_id(settings, rank)
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
