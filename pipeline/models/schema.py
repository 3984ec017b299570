"""The event schema of a configured model (``[events]``), resolved: the schema file parsed, its
role fields found, any field looked up by dotted path with the kinds its use needs.

Each mistake is one :class:`FeatureMapError` line naming the key (the feature map's error:
:mod:`pipeline.models.mapping` raises it too).

Example::

    schema, name = load_event_schema(Path("page_view.avsc"))
    roles = event_roles(settings, schema)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model.features.mapping import EventRoles
from pipeline.connectors.avro.reference import USER_EVENT_SCHEMA_FILE
from pipeline.connectors.avro.schema_fields import (
    FieldKind,
    SchemaField,
    SchemaFieldError,
    schema_field,
)
from pipeline.connectors.avro.schema_registry import SchemaFileError, load_record_schema
from pipeline.settings.loading import Settings

__all__ = ["FeatureMapError", "event_roles", "load_event_schema", "schema_leaf"]


class FeatureMapError(ValueError):
    """A mistake in ``[events]`` or ``[features]``, told in one line naming the key."""


def load_event_schema(path: Path | None) -> tuple[Any, str]:
    """The parsed event schema at ``path`` (``None``: the built-in UserEvent) and its name.

    Raises:
        FeatureMapError: the file is missing, not JSON, not a schema, or not a record.
    """
    chosen = path or USER_EVENT_SCHEMA_FILE
    try:
        return load_record_schema(chosen, "events.schema_file", "the event"), str(chosen)
    except SchemaFileError as exc:
        raise FeatureMapError(str(exc)) from exc


def schema_leaf(
    schema: Any, dotted: str, key: str, kinds: set[FieldKind], what: str
) -> SchemaField:
    """The field at ``dotted``, of one of ``kinds`` (``key``, ``what``: named in the error)."""
    try:
        found = schema_field(schema, dotted)
    except SchemaFieldError as exc:
        raise FeatureMapError(f"{key} = {dotted!r}: {exc}") from exc
    if found.kind not in kinds:
        raise FeatureMapError(
            f"{key} = {dotted!r} is {found.avro_type}; {what} needs "
            f"{' or '.join(sorted(k.value for k in kinds))}"
        )
    return found


def event_roles(settings: Settings, schema: Any) -> EventRoles:
    """The fields playing the pipeline's roles (``[events]``), none of them nullable but
    ``num_results``."""
    events = settings.events

    def role(name: str, kinds: set[FieldKind], what: str) -> SchemaField:
        found = schema_leaf(schema, getattr(events, name), f"events.{name}", kinds, what)
        if found.nullable and name != "num_results":
            raise FeatureMapError(f"events.{name} = {found.name!r} is nullable; the role is not")
        return found

    return EventRoles(
        event_id=role("event_id", {FieldKind.STRING, FieldKind.INT}, "the event id"),
        user_id=role("user_id", {FieldKind.INT}, "the user id"),
        candidates=role("candidates", {FieldKind.INT_LIST}, "the candidate list"),
        event_time=role("event_time", {FieldKind.INT}, "the event time (epoch ms)"),
        num_results=(
            role("num_results", {FieldKind.INT}, "num_results") if events.num_results else None
        ),
        num_results_default=events.num_results_default,
    )
