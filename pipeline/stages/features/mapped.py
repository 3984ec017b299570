"""A configured model's features: the feature map (``[features]``) laid out as its input.

One KJT key per :class:`~model.features.mapping.SparseKey`, in the map's order, one bag per row (one
row per (event, candidate) pair, event-major):

- ``event``: the event's field (single id, or its id list), repeated for each of its rows;
- ``candidate``: the row's candidate id;
- ``user``: a field of the event's user's Redis record, repeated for each of its rows;
- ``item``: a field of the row's item's Redis record.

Ids become table rows by the key's transform (identity with a default row for outside ids,
modulo, or the salted hash), applied once per event (or item), before the repetition. The
dense input is the :class:`~model.features.mapping.DensePart` s side by side; a null event number,
and a missing Redis record, give the part's ``default``. All of it is numpy over whole columns:
no Python work per event or row.

Example::

    inp = MappedFeatures(fmap).build(batch.events, enrichment)   # ModelInput on the CPU
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

from model.features.mapping import DensePart, FeatureMap, SparseKey, Store
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
        values, lengths, per_key = [], [], []
        for key in self._fmap.sparse:
            ids, counts = self._key(key, events, enrichment, event_of_row)
            values.append(ids)
            lengths.append(counts)
            per_key.append(len(ids))
        dense = np.concatenate(
            [self._dense(p, events, enrichment, event_of_row) for p in self._fmap.dense], axis=1
        )
        sparse = sparse_features(
            self._keys,
            torch.from_numpy(np.concatenate(values)),
            torch.from_numpy(np.concatenate(lengths)),
            rows,
            per_key,
        )
        return ModelInput(torch.from_numpy(np.ascontiguousarray(dense)), sparse)

    def _key(
        self,
        key: SparseKey,
        events: EventColumns,
        enrichment: Enrichment,
        event_of_row: Int64Array,
    ) -> tuple[Int64Array, Int64Array]:
        """One key's table rows (all rows' bags back to back) and each row's bag length."""
        rows = events.num_rows
        if key.source is Source.CANDIDATE:
            return table_rows(events.candidate_ids, key), np.ones(rows, dtype=np.int64)
        fields, row_source = _source(key.source, events, enrichment, event_of_row)
        if key.store is Store.INTS:
            return table_rows(fields.ints[:, key.column], key)[row_source], np.ones(
                rows, dtype=np.int64
            )
        starts = fields.list_starts(key.column)[row_source]
        counts = fields.list_counts[row_source, key.column]
        flat = np.repeat(starts, counts) + positions(counts)
        return table_rows(fields.list_ids, key)[flat], counts

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
        if part.source is Source.EVENT:
            values = np.where(np.isnan(values), np.float32(part.default), values)
        elif part.default:
            user = part.source is Source.USER
            missing = enrichment.user_missing if user else enrichment.item_missing
            values = np.where(missing[:, None], np.float32(part.default), values)
        return values[row_source].astype(np.float32, copy=False)


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
