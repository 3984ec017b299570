"""Commit: offsets are committed only after every record they guard is delivered.

=================  ========================================================================
module             job
=================  ========================================================================
``protocol``       :class:`Checkpointer`: the protocol, at-least-once (consumer commits,
                   each result checked)
``transactions``   :class:`TransactionalCheckpointer`: the same protocol, exactly-once
                   (records and offsets in one Kafka transaction)
``calls``          librdkafka's transactional calls, each within a budget the loop can rely on
=================  ========================================================================

``delivery.guarantee`` picks one (:func:`make_checkpointer`); everything else uses the
:class:`Checkpointer` interface.
"""

from __future__ import annotations

from pipeline.connectors.kafka.clients import KafkaClients
from pipeline.settings.delivery import DeliverySettings, Guarantee
from pipeline.settings.kafka import KafkaClientConfig
from pipeline.stages.commit.protocol import Checkpointer
from pipeline.stages.commit.transactions import (
    TRANSACTION_TIMEOUT_S,
    TransactionalCheckpointer,
    TransactionFailed,
    transaction_budget_s,
    transactional_id,
    transactional_kafka,
)
from pipeline.types import Shutdown

__all__ = [
    "Checkpointer",
    "TransactionFailed",
    "TransactionalCheckpointer",
    "make_checkpointer",
    "transactional_id",
    "transactional_kafka",
]


def make_checkpointer(
    delivery: DeliverySettings,
    clients: KafkaClients,
    max_in_flight: int,
    shutdown: Shutdown,
    kafka: KafkaClientConfig | None = None,
) -> Checkpointer:
    """The commit protocol ``delivery.guarantee`` asks for, over the loop's clients.

    Args:
        delivery: ``[delivery]`` (guarantee, transaction interval).
        clients: the consumer and producer (transactional for exactly-once: see
            :func:`transactional_kafka`).
        max_in_flight: ``batching.max_in_flight_batches``.
        shutdown: the run's stop request (every wait ends by its deadline).
        kafka: the configuration the clients were made of (``KafkaSettings.config``;
            exactly-once: the transaction's budget,
            :func:`~pipeline.stages.commit.transactions.transaction_budget_s`; ``None``:
            librdkafka's default).

    Returns:
        A :class:`TransactionalCheckpointer` for exactly-once, else a :class:`Checkpointer`.

    Example::

        checkpointer = make_checkpointer(settings.delivery, clients, 16, shutdown)
    """
    if delivery.guarantee is Guarantee.EXACTLY_ONCE:
        return TransactionalCheckpointer(
            clients.consumer,
            clients.producer,
            delivery.commit_interval_ms / 1000,
            max_in_flight,
            timeout_s=transaction_budget_s(kafka) if kafka is not None else TRANSACTION_TIMEOUT_S,
            shutdown=shutdown,
            renew=clients.new_producer,
        )
    return Checkpointer(
        clients.consumer,
        clients.producer,
        max_in_flight,
        commit_results=clients.commit_results,
        shutdown=shutdown,
        commit_interval_s=delivery.commit_interval_ms / 1000,
    )
