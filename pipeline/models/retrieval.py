"""Resolving a configured model's retrieval (``[retrieval]`` with ``[model.module]``): which vectors
query, which are indexed, and which item ids exist, checked once at start-up.

``retrieval.query`` is one of the module's tables (the row the user id looks up: through the
transform of the table's key whose field is ``events.user_id``) or a ``vector:N`` field of the
user's Redis record; ``retrieval.items`` one of the module's tables (each item's row, through the
transform of the table's ``candidate`` key) or a ``vector:N`` field of each item's record. Each
mistake is one :class:`RetrievalConfigError` line naming the key: no query or items, a table or
field that does not exist or is not a vector, a table no key looks up by the right id, two
widths that differ, a catalogue the configuration cannot give.

The catalogue (which item ids exist; ``retrieval.catalogue``): ``redis`` lists the keys of
``[features.item].key``, ``file`` reads ``retrieval.catalogue_path``, ``table`` takes the rows
of the index table as the ids, which is right only where the candidate key's transform is
``identity`` (a ``modulo`` or ``hash`` row stands for many ids, none of them known).

Example::

    plan = resolve_retrieval(settings, fmap, module_tables(probe))  # None: retrieval off
"""

from __future__ import annotations

from collections.abc import Sequence

from model.features.mapping import (
    FeatureMap,
    OutOfRange,
    RecordField,
    RecordKind,
    RecordLayout,
    Source,
    SparseKey,
    Store,
    Transform,
)
from model.features.spec import SparseFeature
from model.module.types import SEQUENCE, TableConfig
from model.retrieval.sources import RecordVectors, RetrievalPlan, TableVectors, VectorSource
from pipeline.settings.loading import Settings
from pipeline.settings.retrieval import CatalogueSource, VectorSettings

__all__ = ["RetrievalConfigError", "resolve_retrieval", "state_key"]


class RetrievalConfigError(ValueError):
    """A mistake in ``[retrieval]`` for a configured model, told in one line naming the key."""


def state_key(table: TableConfig) -> str:
    """The key of ``table``'s weights in the module's ``state_dict`` (its collection's path:
    ``embedding_bags`` of an ``EmbeddingBagCollection``, ``embeddings`` of an
    ``EmbeddingCollection``).

    Example::

        state_key(t)  # 'sparse_arch.embedding_bag_collection.embedding_bags.t_offer.weight'
    """
    head = f"{table.module_path}." if table.module_path else ""
    tables = "embeddings" if table.kind == SEQUENCE else "embedding_bags"
    return f"{head}{tables}.{table.name}.weight"


def resolve_retrieval(
    settings: Settings,
    fmap: FeatureMap,
    tables: Sequence[TableConfig],
    managed: Sequence[str] = (),
) -> RetrievalPlan | None:
    """The retrieval plan of a configured model (``None`` with ``retrieval.enabled = false``).

    Args:
        settings: ``[retrieval]``, ``[events]``, ``codec.max_id``.
        fmap: the resolved feature map (its keys, roles and Redis layouts).
        tables: the module's own tables, with their collections' paths
            (:func:`model.module.checks.module_tables` of the module built on ``meta``).
        managed: the paths of its managed-collision collections
            (:func:`model.module.checks.managed_collisions`): their tables are refused, since an
            id's row there is the remapper's choice, not its key's transform.

    Returns:
        The plan.

    Raises:
        RetrievalConfigError: the first mistake, one line naming the key.
    """
    retrieval = settings.retrieval
    if not retrieval.enabled:
        return None
    if retrieval.query is None or retrieval.items is None:
        names = " and ".join(
            f"retrieval.{n}" for n in ("query", "items") if getattr(retrieval, n) is None
        )
        raise RetrievalConfigError(
            f"retrieval.enabled = true with [model.module] needs {names}: which vectors query "
            "and which are indexed (docs/byom.md); or set retrieval.enabled = false (every "
            "event then brings its candidates)"
        )
    if retrieval.config.query_features != (SparseFeature.USER_ID,):
        raise RetrievalConfigError(
            "retrieval.query_features: the built-in model's query; a configured model's is "
            "retrieval.query (drop query_features)"
        )
    by_name = {t.name: t for t in tables}
    query = _side("query", retrieval.query, fmap, by_name, managed)
    items = _side("items", retrieval.items, fmap, by_name, managed)
    if query.dim != items.dim:
        raise RetrievalConfigError(
            f"retrieval.query: the query vectors are {query.dim} wide ({_what(query)}) but the "
            f"indexed ones {items.dim} ({_what(items)}): an inner product needs one width"
        )
    rows = 0
    if retrieval.catalogue is CatalogueSource.TABLE:
        rows = _catalogue_rows(items)
    if retrieval.catalogue is CatalogueSource.REDIS and fmap.item is None:
        raise RetrievalConfigError(
            'retrieval.catalogue = "redis" lists the keys of [features.item].key: declare '
            '[features.item], or list the ids with catalogue = "file"'
        )
    return RetrievalPlan(
        query,
        items,
        _item_id_limit(settings.codec.max_id, fmap.sparse),
        fmap.item.key if fmap.item is not None else "",
        rows,
    )


def _side(
    name: str,
    cfg: VectorSettings,
    fmap: FeatureMap,
    tables: dict[str, TableConfig],
    managed: Sequence[str],
) -> TableVectors | RecordVectors:
    where = f"retrieval.{name}"
    if cfg.source is VectorSource.TABLE:
        table = tables.get(cfg.table)
        if table is None:
            raise RetrievalConfigError(
                f"{where}.table = {cfg.table!r}: model.module has no such table (its tables: "
                f"{', '.join(tables)})"
            )
        if table.module_path in managed:
            raise RetrievalConfigError(
                f"{where}.table = {cfg.table!r} is behind a managed-collision remapper "
                f"({table.module_path}): an id's row is the remapper's state, not its key's "
                "transform, so the rows cannot be matched to ids; name a Redis vector field "
                '(source = "user" / "item")'
            )
        keys = [k for k in fmap.sparse if k.key in table.feature_names]
        key = (
            _query_key(where, table, keys, fmap)
            if name == "query"
            else _item_key(where, table, keys)
        )
        return TableVectors(
            table.name, state_key(table), table.num_embeddings, table.embedding_dim, key
        )
    side = Source.USER if cfg.source is VectorSource.USER else Source.ITEM
    layout = fmap.user if side is Source.USER else fmap.item
    layout, field = _vector_field(where, side, layout, cfg.field)
    return RecordVectors(cfg.source, layout, field)


def _query_key(
    where: str, table: TableConfig, keys: list[SparseKey], fmap: FeatureMap
) -> SparseKey:
    """The table's key that looks it up by the user id (``events.user_id``)."""
    user = fmap.roles.user_id
    fields = {f.column: f.field for f in fmap.event_fields if f.store is Store.INTS}
    for key in keys:
        field = fields.get(key.column) if key.store is Store.INTS else None
        if key.source is Source.EVENT and field is not None and field.path == user.path:
            return key
    raise RetrievalConfigError(
        f"{where}.table = {table.name!r}: no key of it is the user id (events.user_id = "
        f"{user.name!r}; its keys: {_describe(keys, fmap)}): the query is the row the user "
        "id looks up"
    )


def _item_key(where: str, table: TableConfig, keys: list[SparseKey]) -> SparseKey:
    """The table's ``candidate`` key (one way of turning an item id into a row)."""
    found = [k for k in keys if k.source is Source.CANDIDATE]
    if not found:
        raise RetrievalConfigError(
            f"{where}.table = {table.name!r}: no candidate key looks it up (its keys: "
            f"{', '.join(f'{k.key} ({k.source})' for k in keys) or 'none'}): the index holds "
            "each item's row, the one its candidate id looks up"
        )
    rows = {(k.transform, k.default_row if k.transform is Transform.IDENTITY else 0) for k in found}
    if len(rows) > 1:
        raise RetrievalConfigError(
            f"{where}.table = {table.name!r}: its candidate keys "
            f"({', '.join(k.key for k in found)}) turn an id into different rows"
        )
    return found[0]


def _vector_field(
    where: str, side: Source, layout: RecordLayout | None, name: str
) -> tuple[RecordLayout, RecordField]:
    if layout is None:
        raise RetrievalConfigError(f"{where}: source = '{side}' needs [features.{side}]")
    try:
        field = layout.field(name)
    except KeyError:
        raise RetrievalConfigError(
            f"{where}.field = {name!r}: [features.{side}] declares no such field (its fields: "
            f"{', '.join(f.name for f in layout.fields)})"
        ) from None
    if field.kind is not RecordKind.VECTOR:
        raise RetrievalConfigError(
            f"{where}.field = {name!r} is an {field.kind}: retrieval needs a vector field "
            "('vector:N')"
        )
    return layout, field


def _catalogue_rows(items: TableVectors | RecordVectors) -> int:
    """The rows of the index table, when they are the item ids (``catalogue = "table"``)."""
    if not isinstance(items, TableVectors):
        raise RetrievalConfigError(
            'retrieval.catalogue = "table" takes the rows of the index table as the item ids: '
            'it needs retrieval.items.source = "table"'
        )
    if items.key.transform is not Transform.IDENTITY:
        raise RetrievalConfigError(
            f'retrieval.catalogue = "table": features.sparse.{items.key.key} turns ids into '
            f"rows of {items.table} by '{items.key.transform}', so a row is not an item id: "
            'list the ids with catalogue = "redis" or "file"'
        )
    return items.num_rows


def _item_id_limit(max_id: int, keys: Sequence[SparseKey]) -> int:
    """Catalogue ids must be below this: ones an event could not bring are never retrieved."""
    limit = max_id + 1
    for key in keys:
        dlq = key.transform is Transform.IDENTITY and key.out_of_range is OutOfRange.DLQ
        if key.source is Source.CANDIDATE and dlq:
            limit = min(limit, key.num_rows)
    return limit


def _what(vectors: TableVectors | RecordVectors) -> str:
    if isinstance(vectors, TableVectors):
        return f"table {vectors.table}"
    return f"features.{vectors.side}.fields.{vectors.field.name} = 'vector:{vectors.dim}'"


def _describe(keys: list[SparseKey], fmap: FeatureMap) -> str:
    fields = {(f.store, f.column): f.field.name for f in fmap.event_fields}
    out = []
    for key in keys:
        where = fields.get((key.store, key.column), "") if key.source is Source.EVENT else ""
        out.append(f"{key.key} ({key.source}{' ' + where if where else ''})")
    return ", ".join(out) or "none"
