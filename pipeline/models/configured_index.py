"""A configured model's retrieval index: one version's, built from its plan
(:mod:`pipeline.models.retrieval`), and the query vectors of the events that ask for candidates.

What is indexed (``retrieval.items``): for each catalogue item, either the row of the module's
table that its id looks up (through the table's ``candidate`` key's transform: items that share
a row share its vector), read from the version's weights, or the ``vector:N`` field of its
Redis record, read for the whole catalogue when the index is built (items without one, or with
a malformed one, are left out of the index: a warning counts them).

The query (``retrieval.query``): the row of the module's table that the event's user id looks
up (through the transform of that table's user-id key), or the ``vector:N`` field of the user's
Redis record, read when the event is retrieved for (through the loop's enricher: its cache and
its outage behaviour; :mod:`pipeline.runtime.retrieve`). An event whose user has no such
vector gets no candidates (``no_candidates``).

Tables are read from the version's ``model.pt`` (memory-mapped: only the tables asked for are
read), never from the served module, which may be sharded over ranks or quantized: every rank
reads the same full fp32 tables on its own, with no collective.

Example::

    index = load_configured_index(version_dir, config, plan, catalogue, client, version, max_bytes)
    queries = index.table_queries(events.user_ids)
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from model.retrieval.index import VectorIndex, index_vectors
from model.retrieval.sources import RecordVectors, RetrievalPlan, TableVectors
from pipeline.connectors.redis.connection import FeatureClient
from pipeline.connectors.redis.vectors import read_vectors
from pipeline.stages.features.mapped import table_rows

if TYPE_CHECKING:
    from model.retrieval.config import RetrievalConfig
    from pipeline.types import FieldColumns

__all__ = ["ConfiguredIndex", "load_configured_index"]

log = logging.getLogger(__name__)

Int64Array = npt.NDArray[np.int64]
Float32Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class ConfiguredIndex(VectorIndex):
    """A configured model version's index, and how its events' queries are made.

    Attributes:
        plan: which vectors query and which are indexed.
        query_table: the query table's rows (a version's weights; ``None``: the query is a
            field of the user's Redis record).

    Example::

        if index.reads_users:
            queries, ok = index.record_queries(enricher.enrich(users, no_items).user_fields)
        else:
            queries, ok = index.table_queries(users), np.ones(len(users), bool)
    """

    plan: RetrievalPlan = field(kw_only=True)
    query_table: Float32Array | None = field(kw_only=True, default=None)

    @classmethod
    def of(
        cls, built: VectorIndex, plan: RetrievalPlan, query_table: Float32Array | None
    ) -> ConfiguredIndex:
        """``built`` (:func:`model.retrieval.index.index_vectors`) with its plan and query table.

        Example::

            index = ConfiguredIndex.of(index_vectors(vectors, ids, config), plan, viewers)
        """
        shared = {f.name: getattr(built, f.name) for f in dataclasses.fields(VectorIndex)}
        return cls(**shared, plan=plan, query_table=query_table)

    @property
    def query_name(self) -> str:
        """What the query is, for messages (``features.user.fields.taste``, ``table t_viewer``)."""
        query = self.plan.query
        if isinstance(query, TableVectors):
            return f"table {query.table}"
        return f"features.{query.side}.fields.{query.field.name}"

    @property
    def reads_users(self) -> bool:
        """Whether the query is a field of the user's Redis record."""
        return self.query_table is None

    def table_queries(self, user_ids: Int64Array) -> Float32Array:
        """The query of each user id: the row of the query table it looks up.

        Args:
            user_ids: int64[E] raw user ids.

        Returns:
            float32[E, dim].
        """
        query = self.plan.query
        assert self.query_table is not None and isinstance(query, TableVectors)
        return np.ascontiguousarray(self.query_table[table_rows(user_ids, query.key)])

    def record_queries(
        self, fields: FieldColumns | None, count: int
    ) -> tuple[Float32Array, npt.NDArray[np.bool_]]:
        """The query of each user from the users' Redis fields (as the enricher reads them).

        Args:
            fields: the users' :class:`~pipeline.types.FieldColumns` (``Enrichment.user_fields``;
                ``None``: nothing read, every user without a vector).
            count: how many users.

        Returns:
            ``(float32[count, dim], bool[count] whether the user has the vector)``.
        """
        query = self.plan.query
        assert isinstance(query, RecordVectors)
        if fields is None:
            return np.zeros((count, self.dim), np.float32), np.zeros(count, dtype=bool)
        column = query.field.column
        vectors = np.array(fields.floats[:, column : column + query.dim], dtype=np.float32)
        ok: npt.NDArray[np.bool_] = np.asarray(np.isfinite(vectors).all(axis=1), dtype=bool)
        vectors[~ok] = 0.0
        return vectors, ok


def load_configured_index(
    checkpoint: Path,
    config: RetrievalConfig,
    plan: RetrievalPlan,
    catalogue: Int64Array,
    client: FeatureClient | None,
    version: str,
    max_value_bytes: int,
) -> ConfiguredIndex | None:
    """The index of the configured model version at ``checkpoint``.

    Args:
        checkpoint: the version's directory (its ``model.pt``).
        config: ``[retrieval]``'s index config (the index kind; ``settings.retrieval.config``,
            as the model loader read it).
        plan: the resolved retrieval.
        catalogue: int64[N] the raw item ids
            (:func:`pipeline.models.catalogue.configured_catalogue`).
        client: the feature store (for item vectors of Redis records).
        version: the version's name.
        max_value_bytes: ``redis.max_value_bytes`` (a longer item record has no vector).

    Returns:
        The index; ``None`` when no catalogue item has a vector (logged).

    Raises:
        ValueError: a table missing from the weights, or of another shape.
        redis.RedisError: Redis failed while the item vectors were read.

    Example::

        index = load_configured_index(path, config, plan, ids, client, "deepfm-1", 1 << 16)
    """
    start = time.perf_counter()
    weights = _Weights(checkpoint)
    items = plan.items
    if isinstance(items, TableVectors):
        ids = catalogue
        vectors = weights.table(items)[table_rows(catalogue, items.key)]
    else:
        assert client is not None, "item vectors from Redis need a client"
        got, present = read_vectors(client, items.layout, items.field, catalogue, max_value_bytes)
        ids, vectors = catalogue[present], got[present]
        if not present.all():
            log.warning(
                "retrieval: %d of %d catalogue items have no valid %s vector in Redis: left "
                "out of the index",
                int((~present).sum()),
                len(catalogue),
                items.field.name,
            )
    if ids.size == 0:
        log.warning(
            "retrieval: no catalogue item has a vector: events without candidates go to the "
            "dead-letter topic (no_candidates) until a model version loads with some"
        )
        return None
    built = index_vectors(np.ascontiguousarray(vectors, np.float32), ids, config, version)
    query = weights.table(plan.query) if isinstance(plan.query, TableVectors) else None
    index = dataclasses.replace(
        ConfiguredIndex.of(built, plan, query), build_seconds=time.perf_counter() - start
    )
    log.info(
        "retrieval index of %s: %s over %d items, built in %.2fs",
        version,
        index.kind.value,
        index.num_items,
        index.build_seconds,
    )
    return index


class _Weights:
    """A version's ``model.pt``, mapped when a table is first asked for."""

    def __init__(self, checkpoint: Path) -> None:
        self._checkpoint = checkpoint
        self._state: dict[str, Any] | None = None

    def table(self, vectors: TableVectors) -> Float32Array:
        """The table's weights, float32 ``[num_rows, dim]`` (a view of the mapped file when
        they are stored as fp32).

        Raises:
            ValueError: the table is missing or of another shape.
        """
        import torch

        from model.store.checkpoint import load_state_dict

        if self._state is None:
            self._state = load_state_dict(self._checkpoint, verify=False, mmap=True)
        tensor = self._state.get(vectors.state_key)
        shape = (vectors.num_rows, vectors.dim)
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != shape:
            got = None if not isinstance(tensor, torch.Tensor) else tuple(tensor.shape)
            raise ValueError(
                f"checkpoint {self._checkpoint}: table {vectors.table} "
                f"({vectors.state_key}) is {got}, expected {shape}"
            )
        return tensor.detach().to(torch.float32).numpy()
