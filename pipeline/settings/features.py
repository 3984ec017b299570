"""``[features]``: how a configured model's input is made from events and Redis (with
``[model.module]``; the built-in model's features are fixed).

- ``[features.sparse.<key>]``: one per KJT key (each a feature of the module's tables): where its
  ids come from and how they become rows of the table.
- ``[[features.dense]]``: the dense input, the concatenation of these parts in order.
- ``[features.user]`` / ``[features.item]``: the Redis layout of the user's and the candidate
  item's record (absent: nothing is read for that side).

Example::

    [features.sparse.viewer]
    source = "event"
    field = "viewer.id"
    transform = "modulo"
    [[features.dense]]
    source = "user"
    field = "taste"
    [features.user]
    key = "viewer:{id}"
    format = "hash"
    fields = { taste = "vector:4", segment = "id" }
"""

from __future__ import annotations

from pydantic import Field, model_validator

from model.features.mapping import Missing, OutOfRange, RecordFormat, Source, Transform
from pipeline.settings.section import Section

__all__ = [
    "DenseSettings",
    "EntitySettings",
    "FeatureSettings",
    "Missing",
    "OutOfRange",
    "RecordFormat",
    "Source",
    "SparseSettings",
    "Transform",
]


class SparseSettings(Section):
    """``[features.sparse.<key>]``: one KJT key."""

    source: Source
    field: str = ""
    """The event field (dotted) or the Redis field name; empty for ``candidate``."""
    transform: Transform = Transform.MODULO
    out_of_range: OutOfRange = OutOfRange.DEFAULT
    default_row: int = 0
    """With ``identity`` and ``out_of_range = "default"``: the row an outside id looks up."""
    max_ids: int = 20
    """A multi-valued field (an array of ids): the first ``max_ids`` are kept."""
    missing: Missing = Missing.EMPTY
    """What the bag holds where the value is missing (a null event field; a user's or item's
    Redis record, or this field of it, missing or malformed): ``empty`` (an empty bag),
    ``row`` (the row ``missing_row``) or ``id`` (the raw id ``missing_id``, transformed) --
    what the model was trained with."""
    missing_row: int | None = None
    """With ``missing = "row"`` (and only then): the table row a missing value looks up."""
    missing_id: int | str | None = None
    """With ``missing = "id"`` (and only then): the raw id a missing value stands for, put
    through ``transform`` like any other; a string for a string field (hashed as its values
    are)."""
    weights: str = ""
    """A weighted key (``model.module.weighted``): where each id's weight comes from, one per
    id of ``field``: an event array of floats or doubles (dotted path) of the same length as
    the ids array (another length dead-letters the event), or a ``weights:<field>`` field of
    the same Redis record. Empty: every id weighs 1.0."""

    @model_validator(mode="after")
    def _valid(self) -> SparseSettings:
        if self.source is Source.CANDIDATE and (self.field or self.weights):
            raise ValueError("a candidate feature takes no field and no weights")
        if self.source is not Source.CANDIDATE and not self.field:
            raise ValueError(f"a {self.source.value} feature needs a field")
        if self.max_ids < 1 or self.default_row < 0:
            raise ValueError("max_ids must be >= 1 and default_row >= 0")
        for name, policy in (("missing_row", Missing.ROW), ("missing_id", Missing.ID)):
            given = getattr(self, name) is not None
            if given and self.missing is not policy:
                raise ValueError(
                    f"{name} is for missing = '{policy}' (missing is '{self.missing}')"
                )
            if not given and self.missing is policy:
                raise ValueError(f"missing = '{policy}' needs {name}")
        if self.missing_row is not None and self.missing_row < 0:
            raise ValueError(f"missing_row = {self.missing_row} must be >= 0")
        return self


class DenseSettings(Section):
    """``[[features.dense]]``: one part of the dense input."""

    source: Source
    field: str
    """A numeric event field (dotted), or a ``vector:N`` field of the Redis record."""
    default: float = 0.0
    """The value when the field is null or the Redis record is missing."""

    @model_validator(mode="after")
    def _valid(self) -> DenseSettings:
        if self.source is Source.CANDIDATE:
            raise ValueError("a dense part comes from the event, the user or the item")
        return self


class EntitySettings(Section):
    """``[features.user]`` / ``[features.item]``: one side's Redis records."""

    key: str
    """The key template: ``{id}`` is the user's (item's) id in decimal, e.g. ``viewer:{id}``."""
    format: RecordFormat = RecordFormat.HASH
    fields: dict[str, str] = Field(default_factory=dict)
    """Field name -> ``vector:N``, ``id`` or ``id_list:N``."""

    @model_validator(mode="after")
    def _valid(self) -> EntitySettings:
        if self.key.count("{id}") != 1 or self.key.replace("{id}", "").count("{"):
            raise ValueError(f"key {self.key!r} must hold {{id}} exactly once")
        if not self.fields:
            raise ValueError("fields: declare the record's fields")
        return self


class FeatureSettings(Section):
    """The feature map of a configured model (see the module docstring)."""

    sparse: dict[str, SparseSettings] = Field(default_factory=dict)
    dense: list[DenseSettings] = Field(default_factory=list)
    user: EntitySettings | None = None
    item: EntitySettings | None = None
    hash_salt: int = 0x5EED
    """Mixed into ``transform = "hash"``: the salt the model was trained with."""

    @property
    def configured(self) -> bool:
        """Whether any feature is mapped."""
        return bool(self.sparse or self.dense or self.user or self.item)
