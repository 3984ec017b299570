"""The Redis records of a configured model (``[features.user]`` / ``[features.item]``),
resolved into :class:`~model.features.mapping.RecordLayout` s, their fields found by name.

A record declares ``vector:N``, ``id``, ``id_list:N`` and ``weights:<an id_list field>``
fields (the weights of that list's ids, one per id); the packed format holds the built-in
layout's shapes only. Each mistake is one :class:`~pipeline.models.schema.FeatureMapError`
line naming the key.

Example::

    user = record_layout("user", settings.features.user)
    field = record_field("features.sparse.segment", Source.USER, "segment", layouts)
"""

from __future__ import annotations

from model.features.mapping import RecordField, RecordKind, RecordLayout
from pipeline.models.schema import FeatureMapError
from pipeline.settings.features import EntitySettings, RecordFormat, Source, SparseSettings

__all__ = ["record_field", "record_layout", "record_weights"]

_MAX_RECORD_FIELDS = 63
"""Fields of one Redis record: the enricher keeps which are present as the bits of one int64."""
_PACKED_SHAPES = {
    "user": ((RecordKind.VECTOR,), (RecordKind.VECTOR, RecordKind.ID_LIST)),
    "item": ((RecordKind.ID, RecordKind.VECTOR),),
}
"""The field kinds, in order, the built-in packed layout holds on each side."""


def record_layout(side: str, entity: EntitySettings | None) -> RecordLayout | None:
    """One side's layout (``None``: that side reads nothing from Redis)."""
    if entity is None:
        return None
    if len(entity.fields) > _MAX_RECORD_FIELDS:
        raise FeatureMapError(
            f"features.{side}.fields: {len(entity.fields)} fields; a record holds at most "
            f"{_MAX_RECORD_FIELDS}"
        )
    counts = dict.fromkeys(RecordKind, 0)
    fields = []
    weights: list[tuple[str, str]] = []
    for name, text in entity.fields.items():
        kind_text, _, width_text = text.partition(":")
        if kind_text == RecordKind.WEIGHTS.value:
            weights.append((name, width_text))  # placed after their lists are known
            continue
        try:
            kind = RecordKind(kind_text)
            width = int(width_text) if width_text else 1
            if (kind is RecordKind.ID) == bool(width_text) or width < 1:
                raise ValueError
        except ValueError:
            raise FeatureMapError(
                f"features.{side}.fields.{name} = {text!r}: expected 'vector:N', 'id', "
                "'id_list:N' or 'weights:<an id_list field>'"
            ) from None
        column = counts[kind]
        counts[kind] += width if kind is RecordKind.VECTOR else 1
        fields.append(RecordField(name, kind, width, column))
    for name, of in weights:
        ids = next((f for f in fields if f.name == of and f.kind is RecordKind.ID_LIST), None)
        if ids is None:
            raise FeatureMapError(
                f"features.{side}.fields.{name} = 'weights:{of}': weights pair with an "
                f"id_list field of the record, and {of!r} is none"
            )
        fields.append(
            RecordField(name, RecordKind.WEIGHTS, ids.width, counts[RecordKind.VECTOR], ids.column)
        )
        counts[RecordKind.VECTOR] += ids.width
    if entity.format is RecordFormat.PACKED:
        shape = tuple(f.kind for f in fields)
        if shape not in _PACKED_SHAPES[side]:
            wanted = " or ".join(
                "(" + ", ".join(k.value for k in s) + ")" for s in _PACKED_SHAPES[side]
            )
            raise FeatureMapError(
                f"features.{side}.fields: the packed layout holds {wanted} in that order, "
                f"got ({', '.join(k.value for k in shape)})"
            )
    return RecordLayout(entity.key, entity.format, tuple(fields))


def record_field(
    where: str, source: Source, name: str, records: dict[Source, RecordLayout | None]
) -> RecordField:
    """The field ``name`` of ``source``'s Redis record (one line naming ``where`` if none)."""
    record = records[source]
    if record is None:
        raise FeatureMapError(f"{where}: source = '{source}' needs [features.{source}]")
    try:
        return record.field(name)
    except KeyError:
        raise FeatureMapError(
            f"{where}.field = {name!r}: [features.{source}] declares no such field (its "
            f"fields: {', '.join(f.name for f in record.fields)})"
        ) from None


def record_weights(
    where: str, cfg: SparseSettings, rf: RecordField, records: dict[Source, RecordLayout | None]
) -> None:
    """A Redis key's ``weights``: a ``weights`` field of its record pairing its id list."""
    wf = record_field(f"{where}.weights", cfg.source, cfg.weights, records)
    if (
        rf.kind is not RecordKind.ID_LIST
        or wf.kind is not RecordKind.WEIGHTS
        or wf.pairs != rf.column
    ):
        raise FeatureMapError(
            f"{where}.weights = {cfg.weights!r}: weights pair with the key's id_list field; "
            f"declare {cfg.weights} = 'weights:{cfg.field}' in [features.{cfg.source}].fields"
            + (
                ""
                if rf.kind is RecordKind.ID_LIST
                else f" ({cfg.field} is an {rf.kind}, not an id_list)"
            )
        )
