"""librdkafka's errors as streamrank's own exception: what the commit protocol and the loop act on.

Every call of the Kafka edge (:mod:`~pipeline.connectors.kafka.consumer`,
:mod:`~pipeline.connectors.kafka.producer`) raises :class:`KafkaClientError` where the client
raised ``KafkaException``, and reports commit results and client errors with it; its attributes
are librdkafka's classification (``retriable``, ``fatal``, ``txn_requires_abort``), which the
exactly-once protocol handles as Kafka Streams does, and :attr:`KafkaClientError.group_busy`,
which a drain waits out.

Example::

    try:
        producer.commit_transaction(5.0)
    except KafkaClientError as exc:
        if exc.retriable and not exc.txn_requires_abort:
            ...  # the same call again
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

__all__ = ["KafkaClientError", "client_call"]

_GROUP_BUSY = frozenset(
    {
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError._STATE,
    }
)
"""Commit errors of a group that is moving partitions (or of a member that must rejoin)."""


class KafkaClientError(Exception):
    """An error of a Kafka client (a failed call, a commit result, an error the consumer
    reported), classified as librdkafka classifies it.

    Attributes:
        name: librdkafka's name of the error (e.g. ``REBALANCE_IN_PROGRESS``, ``_TIMED_OUT``).
        reason: its text.
        retriable: the same call may succeed if tried again.
        fatal: the client is unusable (e.g. a producer fenced by a newer one).
        txn_requires_abort: the open transaction must be aborted.
        group_busy: a commit refused while the consumer group moves partitions (it goes through
            once the group has settled).
        partition_eof: not an error: the end of a partition was reached.
    """

    def __init__(
        self,
        name: str,
        reason: str,
        *,
        retriable: bool = False,
        fatal: bool = False,
        txn_requires_abort: bool = False,
        group_busy: bool = False,
        partition_eof: bool = False,
    ) -> None:
        super().__init__(reason)
        self.name = name
        self.reason = reason
        self.retriable = retriable
        self.fatal = fatal
        self.txn_requires_abort = txn_requires_abort
        self.group_busy = group_busy
        self.partition_eof = partition_eof

    @classmethod
    def of(cls, error: KafkaError | KafkaException | BaseException) -> KafkaClientError:
        """The client's error (a ``KafkaError``, or a ``KafkaException`` carrying one) as ours.

        Example::

            KafkaClientError.of(KafkaError(KafkaError._TIMED_OUT)).name  # "_TIMED_OUT"
        """
        err = error.args[0] if isinstance(error, KafkaException) and error.args else error
        if not isinstance(err, KafkaError):
            return cls(type(error).__name__, str(error))
        code = err.code()
        return cls(
            err.name(),
            str(err),
            retriable=bool(err.retriable()),
            fatal=bool(err.fatal()),
            txn_requires_abort=bool(err.txn_requires_abort()),
            group_busy=code in _GROUP_BUSY,
            partition_eof=code == KafkaError._PARTITION_EOF,
        )

    def __str__(self) -> str:
        return self.reason


def client_call(call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)``, a call of a Kafka client, with a ``KafkaException`` raised as
    :class:`KafkaClientError`."""
    try:
        return call(*args)
    except KafkaException as exc:
        raise KafkaClientError.of(exc) from exc
