"""A configured model's features: the feature map (``[features]``) laid out as its input.

One KJT key per :class:`~model.features.mapping.SparseKey`, in the map's order, one bag per row (one
row per (event, candidate) pair, event-major):

- ``event``: the event's field (single id, or its id list), repeated for each of its rows;
- ``candidate``: the row's candidate id;
- ``user``: a field of the event's user's Redis record, repeated for each of its rows;
- ``item``: a field of the row's item's Redis record.

Ids become table rows by the key's transform (identity with a default row for outside ids,
modulo, or the salted hash), applied once per event (or item), before the repetition. Where
the value is absent (a null event field; a Redis record, or its field, missing or malformed)
the bag is what the key's ``missing`` policy says: empty, the row ``missing_row``, or the row
of the raw id ``missing_id``. An id list keeps its length (a short list is a short bag, an
empty one an empty bag). With a weighted collection (``fmap.weighted``) the KJT carries a weight
per id: a weighted key's from its list (:attr:`~pipeline.types.FieldColumns.list_weights`),
1.0 for every other id, a missing value's policy row included. The dense input is the
:class:`~model.features.mapping.DensePart` s side by side; an absent value (NaN in the columns:
a null event number, a missing Redis record or vector field) gives the part's ``default``. All
of it is numpy over whole columns: no Python work per event or row.

Example::

    inp = MappedFeatures(fmap).build(batch.events, enrichment)   # ModelInput on the CPU
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

from model.features.mapping import DensePart, FeatureMap, Missing, SparseKey, Store
from model.features.model_input import ModelInput, sparse_features
from model.features.segments import positions
from model.features.spec import hash_to_rows
from pipeline.settings.features import Source, Transform
from pipeline.types import Enrichment, EventColumns, FieldColumns

if TYPE_CHECKING:
    from model.serving import Scorer
    from model.serving.transfer import StagedInput

__all__ = ["MappedFeatures", "table_rows"]

Int64Array = npt.NDArray[np.int64]


def table_rows(ids: Int64Array, key: SparseKey) -> Int64Array:
    """Rows of ``key``'s table for raw ``ids`` (its transform).

    Example::

        table_rows(np.array([-3, 12]), SparseKey("k", Source.EVENT, Store.INTS, 0,
                                                 Transform.MODULO, 10))  # [7, 2]
    """
    if key.transform is Transform.MODULO:
        return np.mod(ids, key.num_rows)
    if key.transform is Transform.HASH:
        return hash_to_rows(ids, key.num_rows, key.salt)
    outside = (ids < 0) | (ids >= key.num_rows)
    return np.where(outside, key.default_row, ids) if outside.any() else ids


class MappedFeatures:
    """Builds a configured model's input from the feature map (see the module docstring).

    Args:
        fmap: the resolved feature map.
    """

    def __init__(self, fmap: FeatureMap) -> None:
        self._fmap = fmap
        self._keys = [k.key for k in fmap.sparse]
        self._fill = {k.key: _missing_row(k) for k in fmap.sparse}

    def stage(self, events: EventColumns, enrichment: Enrichment, scorer: Scorer) -> StagedInput:
        """The batch's model input on its way to ``scorer``'s device."""
        return scorer.stage_input(self.build(events, enrichment))

    def build(self, events: EventColumns, enrichment: Enrichment) -> ModelInput:
        """The batch's model input on the CPU.

        Args:
            events: the batch (``events.fields`` decoded with the map).
            enrichment: its records (``user_fields`` / ``item_fields``).

        Returns:
            Dense ``float32[R, D]`` and the KJT, keys in the map's order.
        """
        rows = events.num_rows
        event_of_row = np.repeat(np.arange(events.num_events), events.candidate_counts)
        values, lengths, per_key, weights = [], [], [], []
        for key in self._fmap.sparse:
            ids, counts, key_weights = self._key(key, events, enrichment, event_of_row)
            values.append(ids)
            lengths.append(counts)
            per_key.append(len(ids))
            if self._fmap.weighted:
                weights.append(
                    np.ones(len(ids), dtype=np.float32) if key_weights is None else key_weights
                )
        dense = np.concatenate(
            [self._dense(p, events, enrichment, event_of_row) for p in self._fmap.dense], axis=1
        )
        sparse = sparse_features(
            self._keys,
            torch.from_numpy(np.concatenate(values)),
            torch.from_numpy(np.concatenate(lengths)),
            rows,
            per_key,
            torch.from_numpy(np.concatenate(weights)) if self._fmap.weighted else None,
        )
        return ModelInput(torch.from_numpy(np.ascontiguousarray(dense)), sparse)

    def _key(
        self,
        key: SparseKey,
        events: EventColumns,
        enrichment: Enrichment,
        event_of_row: Int64Array,
    ) -> tuple[Int64Array, Int64Array, npt.NDArray[np.float32] | None]:
        """One key's table rows (all rows' bags back to back), each row's bag length, and its
        ids' weights (``None``: the key has none, each weighs 1.0)."""
        rows = events.num_rows
        if key.source is Source.CANDIDATE:
            return table_rows(events.candidate_ids, key), np.ones(rows, dtype=np.int64), None
        fields, row_source = _source(key.source, events, enrichment, event_of_row)
        if key.store is Store.INTS:  # one id per entity: a list of one
            ids = fields.ints[:, key.column]
            present = fields.int_present[:, key.column]
            if present.all():
                return table_rows(ids, key)[row_source], np.ones(rows, dtype=np.int64), None
            starts, counts = np.arange(len(ids), dtype=np.int64), np.ones(len(ids), np.int64)
        else:
            ids = fields.list_ids
            present = fields.list_present[:, key.column]
            starts, counts = fields.list_starts(key.column), fields.list_counts[:, key.column]
        pool = table_rows(ids, key)
        pool_weights = fields.weights() if key.weighted else None
        if not present.all():  # absent: no ids, or the policy's one row at the pool's end
            fill = self._fill[key.key]
            starts = np.where(present, starts, len(pool))
            counts = np.where(present, counts, 0 if fill is None else 1)
            pool = np.append(pool, 0 if fill is None else fill)
            if pool_weights is not None:  # the policy's row weighs 1.0
                pool_weights = np.append(pool_weights, np.float32(1.0))
        starts, counts = starts[row_source], counts[row_source]
        index = np.repeat(starts, counts) + positions(counts)
        return pool[index], counts, None if pool_weights is None else pool_weights[index]

    def _dense(
        self,
        part: DensePart,
        events: EventColumns,
        enrichment: Enrichment,
        event_of_row: Int64Array,
    ) -> npt.NDArray[np.float32]:
        """One dense part, ``float32[R, width]``."""
        fields, row_source = _source(part.source, events, enrichment, event_of_row)
        values = fields.floats[:, part.column : part.column + part.width]
        values = np.where(np.isnan(values), np.float32(part.default), values)
        return values[row_source].astype(np.float32, copy=False)


def _missing_row(key: SparseKey) -> int | None:
    """The row an absent value of ``key`` looks up (``None``: an empty bag)."""
    if key.missing is Missing.ROW:
        return key.missing_row
    if key.missing is Missing.ID:
        return int(table_rows(np.array([key.missing_id], dtype=np.int64), key)[0])
    return None


def _source(
    source: Source, events: EventColumns, enrichment: Enrichment, event_of_row: Int64Array
) -> tuple[FieldColumns, Int64Array]:
    """The columns a source's fields are in, and for each row the entity it reads."""
    if source is Source.ITEM:
        fields = enrichment.item_fields
        row_source = np.arange(events.num_rows)
    else:
        fields = events.fields if source is Source.EVENT else enrichment.user_fields
        row_source = event_of_row
    if fields is None:
        raise ValueError(
            f"the batch has no {source.value} fields: decoded or enriched without the map"
        )
    return fields, row_source
