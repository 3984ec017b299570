"""The ranker's input contract: which features exist and how raw values map to table rows.

A scored *row* is one (event, candidate item) pair. Each row carries:

- sparse features (one TorchRec ``KeyedJaggedTensor`` key each, one embedding table each):

  ============== ============== =============================================================
  key            values per row where the raw value comes from
  ============== ============== =============================================================
  user_id        1              ``UserEvent.user_id``
  item_id        1              the candidate item id
  item_category  1              Redis item features (``category``)
  device         1              ``UserEvent.context.device`` (string, hashed to 64 bits)
  country        1              ``UserEvent.context.country`` (string, hashed to 64 bits)
  recent_items   0..cap         ``UserEvent.recent_item_ids`` then Redis ``recent`` items
  ============== ============== =============================================================

- dense features: the user's dense vector (Redis) followed by the item's dense vector (Redis).

Raw ids are arbitrary signed 64-bit values; :func:`hash_to_rows` maps them into a table's rows
with a salted 64-bit mix, vectorised over numpy arrays.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from model.features.layout import InputLayout
from model.module.types import TableConfig

#: Where the built-in ranker keeps its ``EmbeddingBagCollection`` (the sharding plan's key).
BUILTIN_COLLECTION_PATH = "model.sparse_arch.embedding_bag_collection"


class SparseFeature(enum.StrEnum):
    """Names of the sparse features (the KJT keys), in the order the KJT holds them."""

    USER_ID = "user_id"
    ITEM_ID = "item_id"
    ITEM_CATEGORY = "item_category"
    DEVICE = "device"
    COUNTRY = "country"
    RECENT_ITEMS = "recent_items"


SPARSE_FEATURE_ORDER: tuple[SparseFeature, ...] = tuple(SparseFeature)


@dataclass(frozen=True)
class TableSpec:
    """One embedding table.

    Args:
        feature: the sparse feature (KJT key) that looks up this table.
        num_embeddings: rows in the table; raw ids are hashed into ``[0, num_embeddings)``.
    """

    feature: SparseFeature
    num_embeddings: int

    @property
    def name(self) -> str:
        return f"t_{self.feature.value}"

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The KJT key that looks this table up."""
        return (self.feature.value,)


def _default_tables() -> tuple[TableSpec, ...]:
    return (
        TableSpec(SparseFeature.USER_ID, 200_000),
        TableSpec(SparseFeature.ITEM_ID, 100_000),
        TableSpec(SparseFeature.ITEM_CATEGORY, 1_000),
        TableSpec(SparseFeature.DEVICE, 64),
        TableSpec(SparseFeature.COUNTRY, 256),
        TableSpec(SparseFeature.RECENT_ITEMS, 100_000),
    )


@dataclass(frozen=True)
class FeatureSpec:
    """Everything that fixes the ranker's input layout and architecture.

    Args:
        tables: one table per sparse feature, in :data:`SPARSE_FEATURE_ORDER`.
        embedding_dim: shared by every table (DLRM's interaction needs one width).
        user_dense_dim: length of the user's dense vector.
        item_dense_dim: length of the item's dense vector.
        recent_items_cap: most recent items used per event (longer lists are truncated).
        dense_arch: DLRM bottom MLP sizes; the last must equal ``embedding_dim``.
        over_arch: DLRM top MLP sizes; the last must be 1.
        hash_salt: mixed into every hashed id, so a new salt re-randomises table rows.

    Example::

        spec = FeatureSpec(embedding_dim=32, dense_arch=(64, 32))
        rows = spec.hash_ids(SparseFeature.ITEM_ID, np.array([10**15, 7]))
    """

    tables: tuple[TableSpec, ...] = field(default_factory=_default_tables)
    embedding_dim: int = 64
    user_dense_dim: int = 8
    item_dense_dim: int = 8
    recent_items_cap: int = 20
    dense_arch: tuple[int, ...] = (512, 256, 64)
    over_arch: tuple[int, ...] = (512, 512, 256, 1)
    hash_salt: int = 0x5EED

    def __post_init__(self) -> None:
        features = tuple(t.feature for t in self.tables)
        if features != SPARSE_FEATURE_ORDER:
            raise ValueError(
                f"tables must cover {[f.value for f in SPARSE_FEATURE_ORDER]} in that order, "
                f"got {[f.value for f in features]}"
            )
        if any(t.num_embeddings < 1 for t in self.tables):
            raise ValueError("every table needs num_embeddings >= 1")
        if not self.dense_arch or self.dense_arch[-1] != self.embedding_dim:
            raise ValueError(
                f"dense_arch must end with embedding_dim={self.embedding_dim}, "
                f"got {self.dense_arch}"
            )
        if not self.over_arch or self.over_arch[-1] != 1:
            raise ValueError(f"over_arch must end with 1, got {self.over_arch}")

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> FeatureSpec:
        """A spec from configuration-shaped values; keys left out keep their defaults.

        Keys are :data:`SPEC_SETTING_KEYS`: every field but ``tables`` and ``hash_salt``, plus
        ``num_embeddings``, rows per table by feature name (features left out keep theirs).
        Sequences become tuples.

        Args:
            values: e.g. the ``[model]`` section of ``streamrank.toml``.

        Returns:
            The spec (its own validation applies).

        Raises:
            ValueError: on unknown keys or feature names.

        Example::

            FeatureSpec.from_settings({"embedding_dim": 32, "dense_arch": [64, 32],
                                       "num_embeddings": {"user_id": 5000}})
        """
        unknown = set(values) - set(SPEC_SETTING_KEYS)
        if unknown:
            raise ValueError(f"unknown FeatureSpec settings {sorted(unknown)}")
        rows = dict(values.get("num_embeddings", {}))
        unknown_features = set(rows) - {f.value for f in SparseFeature}
        if unknown_features:
            raise ValueError(f"num_embeddings: unknown features {sorted(unknown_features)}")
        kwargs: dict[str, Any] = {
            name: tuple(value) if isinstance(value, list | tuple) else value
            for name, value in values.items()
            if name != "num_embeddings"
        }
        tables = tuple(
            TableSpec(t.feature, int(rows.get(t.feature.value, t.num_embeddings)))
            for t in _default_tables()
        )
        return cls(tables=tables, **kwargs)

    @property
    def dense_dim(self) -> int:
        """Width of the dense input: user vector then item vector."""
        return self.user_dense_dim + self.item_dense_dim

    @property
    def feature_names(self) -> list[str]:
        return [f.value for f in SPARSE_FEATURE_ORDER]

    def ids_per_row(self, feature: SparseFeature) -> int:
        """Ids one row looks up in ``feature``'s table at most (``recent_items_cap`` for
        ``recent_items``, else 1)."""
        return self.recent_items_cap if feature is SparseFeature.RECENT_ITEMS else 1

    def input_layout(self) -> InputLayout:
        """The model input's keys, dense width and ids per row and key."""
        return InputLayout(
            tuple(self.feature_names),
            self.dense_dim,
            tuple(self.ids_per_row(f) for f in SPARSE_FEATURE_ORDER),
        )

    def table_configs(self) -> tuple[TableConfig, ...]:
        """The built-in ranker's tables as the model contract describes any module's."""
        return tuple(
            TableConfig(
                t.name,
                t.num_embeddings,
                self.embedding_dim,
                t.feature_names,
                ids_per_row=self.ids_per_row(t.feature),
                module_path=BUILTIN_COLLECTION_PATH,
            )
            for t in self.tables
        )

    def table(self, feature: SparseFeature) -> TableSpec:
        return self.tables[SPARSE_FEATURE_ORDER.index(feature)]

    def hash_ids(
        self, feature: SparseFeature, raw_ids: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """Map raw 64-bit ids to rows of ``feature``'s table (vectorised)."""
        return hash_to_rows(raw_ids, self.table(feature).num_embeddings, self.hash_salt)


#: The keys :meth:`FeatureSpec.from_settings` takes: the spec's fields as configuration sets
#: them (``num_embeddings`` by feature name instead of ``tables``; ``hash_salt`` is fixed).
SPEC_SETTING_KEYS: tuple[str, ...] = (
    "num_embeddings",
    *(f.name for f in fields(FeatureSpec) if f.name not in ("tables", "hash_salt")),
)

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def hash_to_rows(
    raw_ids: npt.NDArray[np.int64], num_rows: int, salt: int = 0
) -> npt.NDArray[np.int64]:
    """Hash signed 64-bit ids into ``[0, num_rows)`` with the splitmix64 finaliser.

    Args:
        raw_ids: any integer array (viewed as unsigned 64-bit).
        num_rows: table size.
        salt: mixed in before hashing.

    Returns:
        int64 array of row indices, same shape as ``raw_ids``.
    """
    z = np.asarray(raw_ids, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        z = z + (_GOLDEN * np.uint64(salt & 0xFFFFFFFFFFFFFFFF))
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(num_rows)).astype(np.int64)


def string_to_id(value: str) -> int:
    """A stable signed 64-bit id for a categorical string (device, country).

    Python's ``hash()`` is salted per process, so it cannot be used: training, offline scoring
    and every pipeline rank must agree. Callers cache results (the vocabularies are small).
    """
    digest = hashlib.blake2b(value.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


_SPEC_SCALAR_FIELDS: tuple[str, ...] = (
    "embedding_dim",
    "user_dense_dim",
    "item_dense_dim",
    "recent_items_cap",
    "hash_salt",
)
_SPEC_TUPLE_FIELDS: tuple[str, ...] = ("dense_arch", "over_arch")


def spec_to_dict(spec: FeatureSpec) -> dict[str, object]:
    """A JSON-ready dict describing ``spec`` (the inverse of :func:`spec_from_dict`).

    Args:
        spec: the spec to describe.

    Returns:
        A dict of plain ints, lists and strings. ``tables`` lists every table with its
        ``feature``, ``num_embeddings`` and (informational) ``name``.

    Example::

        assert spec_from_dict(spec_to_dict(spec)) == spec
    """
    out: dict[str, object] = {
        "tables": [
            {"feature": t.feature.value, "num_embeddings": t.num_embeddings, "name": t.name}
            for t in spec.tables
        ]
    }
    for name in _SPEC_SCALAR_FIELDS:
        out[name] = int(getattr(spec, name))
    for name in _SPEC_TUPLE_FIELDS:
        out[name] = [int(v) for v in getattr(spec, name)]
    return out


def spec_from_dict(data: Mapping[str, Any]) -> FeatureSpec:
    """Rebuild a :class:`FeatureSpec` from :func:`spec_to_dict`'s output.

    Args:
        data: the dict (e.g. parsed from a checkpoint's ``meta.json``).

    Returns:
        The spec; ``FeatureSpec``'s own validation applies.

    Raises:
        ValueError: on missing or unknown keys, unknown features or badly typed values.

    Example::

        spec = spec_from_dict(json.loads(path.read_text())["spec"])
    """
    expected = {"tables", *_SPEC_SCALAR_FIELDS, *_SPEC_TUPLE_FIELDS}
    missing = expected - set(data)
    unknown = set(data) - expected
    if missing or unknown:
        raise ValueError(
            f"bad FeatureSpec dict: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}"
        )
    try:
        tables = tuple(
            TableSpec(SparseFeature(str(t["feature"])), _as_int(t["num_embeddings"]))
            for t in data["tables"]
        )
        kwargs: dict[str, Any] = {name: _as_int(data[name]) for name in _SPEC_SCALAR_FIELDS}
        for name in _SPEC_TUPLE_FIELDS:
            kwargs[name] = tuple(_as_int(v) for v in data[name])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"bad FeatureSpec dict: {exc!r}") from exc
    return FeatureSpec(tables=tables, **kwargs)


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {value!r}")
    return value
