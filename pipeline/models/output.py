"""Resolving the output contract: ``[output]`` -> the write program of the user's output schema,
every role checked at start-up.

Each mistake is one :class:`OutputContractError` line naming the key: a schema file that does
not parse or is not a record, a role at a field the schema lacks or holds with another type, a
per-item role outside an array (or a per-event one inside), a task score naming no column of
``model.module.output_names``, an echoed event field of another type than the output's field, a
field no role fills that has no default.

Example::

    contract = resolve_output(settings, fmap)
    contract.program     # what the publish stage runs (None: the built-in Recommendation)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.features.mapping import FeatureMap, FieldKind, Store
from pipeline.connectors.avro.output_roles import Binding, EchoSource, OutputSchemaError, Role
from pipeline.connectors.avro.reference import RECOMMENDATION_SCHEMA_FILE
from pipeline.connectors.avro.schema_fields import SchemaFieldError, named_types, schema_node
from pipeline.connectors.avro.schema_registry import SchemaFileError, load_record_schema
from pipeline.connectors.avro.write_program import WriteProgram, compile_writer
from pipeline.settings.loading import Settings
from pipeline.settings.output import ROLE_KEYS

__all__ = ["OutputContract", "OutputContractError", "published_columns", "resolve_output"]


class OutputContractError(ValueError):
    """A mistake in ``[output]``, told in one line naming the key."""


@dataclass(frozen=True)
class OutputContract:
    """The user's output schema, ready to write.

    Attributes:
        schema_file: the ``.avsc`` (registered under ``<topics.output>-value`` in Confluent
            framing).
        program: the schema and its roles, compiled; ``None``: the built-in Recommendation
            (its own compiled encoder).
        task_names: the published task scores, in the order of
            :attr:`~pipeline.types.ScoredBatch.task_scores`' columns.
    """

    schema_file: Path = RECOMMENDATION_SCHEMA_FILE
    program: WriteProgram | None = None
    task_names: tuple[str, ...] = ()


def load_output_schema(path: Path) -> Any:
    """The parsed output schema at ``path``.

    Raises:
        OutputContractError: the file is missing, not JSON, not a schema, or not a record.
    """
    try:
        return load_record_schema(path, "output.schema_file", "the output")
    except SchemaFileError as exc:
        raise OutputContractError(str(exc)) from exc


def published_columns(settings: Settings) -> tuple[int, ...]:
    """The module's output columns the output publishes (``output.task_scores``), in order:
    what the scorer carries beside the ranking score (``OutputConfig.task_columns``).

    Raises:
        OutputContractError: a task score names no column of ``model.module.output_names``,
            or the model has no named columns.
    """
    names = settings.output.task_scores
    if not names:
        return ()
    module = settings.model.module
    if module is None:
        first = next(iter(names))
        raise OutputContractError(
            f"output.task_scores.{first}: the built-in model has one output column (the "
            "ranking score, output.scores); task scores are a configured model's named columns"
        )
    columns = module.output_names
    for name in names:
        if name not in columns:
            listed = f"its names: {', '.join(columns)}" if columns else "it is empty"
            raise OutputContractError(
                f"output.task_scores.{name}: model.module.output_names has no column {name!r} "
                f"({listed}: name every column of the module's output)"
            )
    return tuple(columns.index(name) for name in names)


def _path(key: str, dotted: str) -> tuple[str, ...]:
    parts = tuple(dotted.split("."))
    if not all(parts):
        raise OutputContractError(f"{key} = {dotted!r}: not a dotted field path")
    return parts


def _echo(name: str, dotted: str, fmap: FeatureMap) -> EchoSource:
    """The event field ``output.echo.<name>`` carries (decoded raw by the configured decode)."""
    found = next(
        (f for f in fmap.event_fields if f.store is Store.RAW and f.field.name == dotted), None
    )
    if found is None:  # resolve_feature_map adds every echo: a map of other settings lacks it
        raise OutputContractError(
            f"output.echo.{name} = {dotted!r}: not decoded by the feature map"
        )
    try:
        node, nullable = schema_node(fmap.schema, dotted)
    except SchemaFieldError as exc:
        raise OutputContractError(f"output.echo.{name} = {dotted!r}: {exc}") from exc
    return EchoSource(found.column, dotted, node, named_types(fmap.schema), nullable)


def resolve_output(settings: Settings, fmap: FeatureMap | None = None) -> OutputContract:
    """The output contract ``settings`` describe, checked against its schema.

    Args:
        settings: ``[output]`` (and ``[model.module]``'s ``output_names``).
        fmap: a configured model's feature map (its event id's type, the echoed fields);
            ``None`` for the built-in model.

    Returns:
        The contract; without ``output.schema_file``, the built-in Recommendation's.

    Raises:
        OutputContractError: the first mistake, in one line naming its key.
    """
    out = settings.output
    if out.schema_file is None:
        return OutputContract()
    schema = load_output_schema(out.schema_file)
    published_columns(settings)  # every task score names a column
    if out.echo and fmap is None:
        first = next(iter(out.echo))
        raise OutputContractError(
            f"output.echo.{first}: echoed fields are read by a configured model's decode: set "
            "[model.module] (and [events] for an event schema of yours)"
        )
    bindings = [
        Binding(f"output.{key}", _path(f"output.{key}", getattr(out, key)), Role(key))
        for key in ROLE_KEYS
        if getattr(out, key)
    ]
    bindings += [
        Binding(f"output.task_scores.{name}", _path(f"output.task_scores.{name}", dotted),
                Role.TASK_SCORE, column)
        for column, (name, dotted) in enumerate(out.task_scores.items())
    ]  # fmt: skip
    if fmap is not None:
        bindings += [
            Binding(f"output.echo.{name}", _path(f"output.echo.{name}", name), Role.ECHO,
                    echo=_echo(name, dotted, fmap))
            for name, dotted in out.echo.items()
        ]  # fmt: skip
    event_id_long = fmap is not None and fmap.roles.event_id.kind is FieldKind.INT
    try:
        program = compile_writer(schema, bindings, event_id_long)
    except OutputSchemaError as exc:
        raise OutputContractError(str(exc)) from exc
    return OutputContract(out.schema_file, program, tuple(out.task_scores))
