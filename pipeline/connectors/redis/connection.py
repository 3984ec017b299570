"""The enrichers' connection to the feature store: packed commands out, replies in, and Redis's
errors as streamrank's own; and the model loader's client (:func:`bulk_client`).

An enricher (:mod:`pipeline.stages.enrich`) sends a batch's reads as one packed request and
reads the replies on one connection of its own (:class:`FeatureConnection`); it never sees a
``redis`` type. A failed send or read raises :class:`FeatureStoreUnavailable` (the connection is
closed; the next send opens a new one), an error reply of one record (e.g. ``WRONGTYPE``: a key
of another type) :class:`RecordRefused`, read whole so that the replies after it stay in step.

Example::

    connection = FeatureConnection(settings.redis)
    connection.send([mget_request(prefix, user_ids, item_ids)])
    values = connection.read()
"""

from __future__ import annotations

from typing import Any

import redis

from pipeline.connectors.redis.feature_store import enrichment_client
from pipeline.settings.redis import RedisSettings

__all__ = [
    "FeatureClient",
    "FeatureConnection",
    "FeatureStoreUnavailable",
    "RecordRefused",
    "bulk_client",
]

FeatureClient = redis.Redis
"""A client of the feature store: what a connection is taken from (tests pass one that counts
its commands), what the model loader reads the catalogue and the items' vectors with."""


def bulk_client(settings: RedisSettings) -> FeatureClient:
    """The model loader's client, for reads off the scoring path (the retrieval catalogue's
    SCAN, the items' vectors of a configured model's index): the settings' TLS/auth, and
    redis-py's own timeouts and retries, not the enrichers' short ones
    (:func:`~pipeline.connectors.redis.feature_store.enrichment_client`).

    Example::

        client = bulk_client(settings.redis)
    """
    return redis.Redis.from_url(settings.url, **settings.client_kwargs())


class FeatureStoreUnavailable(Exception):
    """Redis could not be reached, or a command on the connection failed (``redis.RedisError``)."""


class RecordRefused(FeatureStoreUnavailable):
    """Redis answered one command with an error reply (``redis.ResponseError``)."""


class FeatureConnection:
    """One connection of its own to the feature store (see the module docstring).

    Args:
        settings: URL, timeouts, TLS/auth; the client has no client-side retries (an outage
            costs one timeout, then defaults).
        client: an existing client to take the connection from (tests); built from
            ``settings`` otherwise.
    """

    def __init__(self, settings: RedisSettings, client: FeatureClient | None = None) -> None:
        client = client or enrichment_client(settings)
        self._connection = client.connection_pool.make_connection()
        """Opened by the first send, closed by an error, opened again by the next send."""

    def send(self, commands: list[bytes]) -> None:
        """Send packed ``commands`` (RESP) in one write.

        Raises:
            FeatureStoreUnavailable: the connection or the write failed.
        """
        try:
            self._connection.send_packed_command(commands)
        except redis.RedisError as exc:
            raise FeatureStoreUnavailable(str(exc)) from exc

    def read(self) -> Any:
        """The next reply (bytes, ``None``, or a list of them).

        Raises:
            RecordRefused: an error reply, read whole (the next reply is the next command's).
            FeatureStoreUnavailable: the read failed (timeout, connection lost).
        """
        try:
            return self._connection.read_response()
        except redis.ResponseError as exc:
            raise RecordRefused(str(exc)) from exc
        except redis.RedisError as exc:
            raise FeatureStoreUnavailable(str(exc)) from exc

    def disconnect(self) -> None:
        """Close the connection (replies left unread must not answer the next send)."""
        self._connection.disconnect()
