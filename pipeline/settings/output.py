"""``[output]``: the schema of the records written to ``topics.output`` and the field that plays
each role.

Absent (no ``schema_file``): the built-in ``schemas/recommendation.avsc``. With ``schema_file``,
any Avro record schema of yours is written (in ``codec.framing``, registered under
``<topics.output>-value`` in Confluent framing); each role names a field of it, dotted for a
field inside a nested record. The ranked items are an array: either an array of records (a path
through it, ``ranked.listing_id``: one record per item, each per-item role a field of it) or
parallel arrays (``listing_ids``: an array of longs; the scores another array of doubles).
Every field no role fills is written with its default; one without a default is a start-up
error (docs/byom.md, "Your output").

Example::

    [output]
    schema_file = "examples/dcn/listing_ranking.avsc"
    event_id = "request_id"
    items = "ranked.listing_id"
    scores = "ranked.score"
    task_scores = { click = "ranked.p_click", purchase = "ranked.p_purchase" }
    model_version = "model"
    scored_at = "scored_at_ms"
    fallback_features = "degraded"
    echo = { shopper = "session.shopper_id", country = "session.country" }
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from pipeline.settings.section import Section

__all__ = ["ROLE_KEYS", "OutputSettings"]

ROLE_KEYS = (
    "event_id",
    "user_id",
    "items",
    "scores",
    "model_version",
    "scored_at",
    "event_time",
    "fallback_features",
    "retrieved",
)
"""The single-field roles, in the order they are checked."""


class OutputSettings(Section):
    """The output schema (``schema_file``) and its roles; unset: the built-in Recommendation."""

    schema_file: Path | None = None
    """An ``.avsc`` file with one record schema; unset: the built-in Recommendation."""
    event_id: str = ""
    """A string field (or a long one, when the event's id is a long): the event's id."""
    user_id: str = ""
    """A long field: the event's user id."""
    items: str = ""
    """Required with ``schema_file``: per item, a long (the ranked item id), best first. A path
    through an array of records (``ranked.item``), or an array of longs (``item_ids``)."""
    scores: str = ""
    """Per item, a double or float: the ranking score (after ``score_weights``)."""
    task_scores: dict[str, str] = Field(default_factory=dict)
    """Per item, a double or float for each named output column
    (``model.module.output_names``): ``{ click = "ranked.p_click" }``."""
    model_version: str = ""
    """A string field: the version of the model that scored the event."""
    scored_at: str = ""
    """A long field: when the event was scored, epoch milliseconds."""
    event_time: str = ""
    """A long field: the event's own time (``events.event_time``), epoch milliseconds."""
    fallback_features: str = ""
    """An array of strings (``user_features``, ``item_features``: the feature groups that fell
    back to defaults), or a boolean (whether any did)."""
    retrieved: str = ""
    """A boolean field: whether the candidates were retrieved (``[retrieval]``)."""
    echo: dict[str, str] = Field(default_factory=dict)
    """Input event fields carried into the output: ``{ "output.field" = "event.field" }``
    (paths dotted on both sides; a configured event schema, ``[events]``)."""

    @model_validator(mode="after")
    def _valid(self) -> OutputSettings:
        roles = [k for k in ROLE_KEYS if getattr(self, k)]
        roles += [f"task_scores.{k}" for k in self.task_scores]
        roles += [f"echo.{k}" for k in self.echo]
        if self.schema_file is None:
            if roles:
                raise ValueError(
                    f"output.{roles[0]} is set but output.schema_file is not: roles map the "
                    "fields of an output schema of yours (the built-in Recommendation has its "
                    "own)"
                )
            return self
        if not self.items:
            raise ValueError(
                "output.items must name the field that holds the ranked item ids (e.g. "
                '"ranked.item_id" in an array of records, or "item_ids", an array of longs)'
            )
        for key, value in [*self.task_scores.items(), *self.echo.items()]:
            if not key or not value:
                raise ValueError(f"output: {key!r} = {value!r}: both sides must name a field")
        return self

    @property
    def configured(self) -> bool:
        """Whether an output schema of the user's is named (else the built-in
        Recommendation)."""
        return self.schema_file is not None
