"""Avro schemas and the Confluent schema registry: schema files, lookups by id, registration.

The decoders (:mod:`pipeline.connectors.avro.reference`, :mod:`pipeline.stages.decode`) read writer
schemas through :class:`SchemaLookup`; only a schema id the registry does not know is the message's
fault.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import fastavro
from fastavro.types import Schema

log = logging.getLogger(__name__)


def load_schema(path: Path) -> Schema:
    """Parse an ``.avsc`` file with fastavro (named types resolved)."""
    with path.open() as f:
        return fastavro.parse_schema(json.load(f))


class SchemaFileError(ValueError):
    """A schema file that is not a record schema, told in one line naming its setting."""


def load_record_schema(path: Path, key: str, what: str) -> Schema:
    """The parsed record schema at ``path`` (the file of setting ``key``, which holds ``what``).

    Raises:
        SchemaFileError: the file is missing, not JSON, not a schema, or not a record.

    Example::

        load_record_schema(Path("page_view.avsc"), "events.schema_file", "the event")
    """
    try:
        schema = fastavro.parse_schema(json.loads(path.read_text()))
    except OSError as exc:
        raise SchemaFileError(f"{key} {path}: {exc.strerror or exc}") from exc
    except Exception as exc:  # JSONDecodeError, SchemaParseException, ...
        raise SchemaFileError(
            f"{key} {path} is not an Avro schema: {' '.join(str(exc).split())}"
        ) from exc
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise SchemaFileError(f"{key} {path}: {what} must be a record schema")
    return schema


def schema_text(path: Path) -> str:
    """The schema file's canonical JSON text (what a registry stores)."""
    with path.open() as f:
        return json.dumps(json.load(f))


class UnknownSchemaId(LookupError):
    """The registry answered that a schema id does not exist (HTTP 404, error 40403)."""


class RegistryUnavailable(RuntimeError):
    """The registry kept failing (network, 5xx) for longer than the lookup retries: not a
    fault of the message, so it is never dead-lettered (the run stops uncommitted)."""


class SchemaLookup:
    """Schema-registry access for the Confluent framing, cached by id and by subject.

    A lookup that fails for another reason than "not found" (the registry unreachable, a 5xx)
    is retried with exponential backoff for up to ``retry_for_s``: a valid event is never
    dead-lettered because the registry had a bad moment.

    Args:
        url: the registry's base URL (``mock://name`` gives confluent_kafka's in-memory one).
        extra: other ``SchemaRegistryClient`` settings (``basic.auth.user.info``...).
        retry_for_s: how long to retry a failing lookup before :class:`RegistryUnavailable`.
    """

    retry_first_s = 0.1
    retry_max_s = 5.0

    def __init__(
        self, url: str, extra: dict[str, str] | None = None, retry_for_s: float = 120.0
    ) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        self._retry_for_s = retry_for_s

        # new_client: a "mock://" URL gives confluent_kafka's in-memory registry.
        self._client = SchemaRegistryClient.new_client({"url": url, **(extra or {})})
        self._by_id: dict[int, Schema] = {}
        self._ids: dict[str, int] = {}

    def writer_schema(self, schema_id: int) -> Schema:
        """The parsed schema registered under ``schema_id``.

        Raises:
            UnknownSchemaId: the registry does not know ``schema_id``.
            RegistryUnavailable: the registry kept failing for ``retry_for_s``.
        """
        cached = self._by_id.get(schema_id)
        if cached is None:
            schema_str = self._fetch(schema_id)
            if not schema_str:
                raise ValueError(f"registry returned no schema text for id {schema_id}")
            cached = fastavro.parse_schema(json.loads(schema_str))
            self._by_id[schema_id] = cached
        return cached

    def _fetch(self, schema_id: int) -> str | None:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        deadline = time.monotonic() + self._retry_for_s
        wait_s = self.retry_first_s
        while True:
            try:
                return self._client.get_schema(schema_id).schema_str
            except SchemaRegistryError as exc:
                if exc.http_status_code == 404:
                    raise UnknownSchemaId(f"schema id {schema_id}: {exc}") from exc
                error: Exception = exc
            except Exception as exc:  # network errors of the HTTP client
                error = exc
            if time.monotonic() + wait_s > deadline:
                raise RegistryUnavailable(
                    f"schema registry failing for {self._retry_for_s:.0f}s: {error}"
                ) from error
            log.warning("schema registry lookup of id %d failed (%s): retrying", schema_id, error)
            time.sleep(wait_s)
            wait_s = min(wait_s * 2, self.retry_max_s)

    def register(self, subject: str, schema_path: Path) -> int:
        """Register the schema file under ``subject`` (idempotent) and return its id."""
        schema_id = self._ids.get(subject)
        if schema_id is None:
            from confluent_kafka.schema_registry import Schema as RegistrySchema

            schema_id = self._client.register_schema(
                subject, RegistrySchema(schema_text(schema_path), "AVRO")
            )
            self._ids[subject] = schema_id
        return schema_id
