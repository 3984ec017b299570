"""What the pipeline and the trainer see of sampled events: feature columns, clicks, records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from model.features.columns import FeatureColumns
from model.features.recent_items import merge_recent_items
from model.features.segments import offsets, segment_ids
from model.features.spec import FeatureSpec
from model.synthetic.events import SampledEvents
from model.synthetic.world import SyntheticWorld

__all__ = ["feature_columns", "row_click_probability", "sample_labels", "to_event_dicts"]

Float32Array = npt.NDArray[np.float32]
Float64Array = npt.NDArray[np.float64]


def feature_columns(
    events: SampledEvents, world: SyntheticWorld, spec: FeatureSpec | None = None
) -> FeatureColumns:
    """The batch's features exactly as the pipeline sees them after Redis enrichment.

    The rule the pipeline must follow too:

    - ``user_dense``: the user's stored dense vector; ``item_category`` / ``item_dense``: each
      candidate's stored category and dense vector.
    - recent list of an event: :func:`model.features.recent_items.merge_recent_items` of the event's
      ``recent_item_ids`` and the user's stored Redis ``recent`` items.

    Args:
        events: the events.
        world: the world they were drawn from.
        spec: supplies ``recent_items_cap`` and the dense widths (checked against the world);
            defaults to ``FeatureSpec()``.

    Returns:
        Validated :class:`FeatureColumns`.

    Raises:
        ValueError: if the world's dense widths differ from the spec's.

    Example::

        cols = feature_columns(world.sample_events(100, rng), world, spec)
    """
    spec = spec if spec is not None else FeatureSpec()
    cfg = world.config
    if (cfg.user_dense_dim, cfg.item_dense_dim) != (spec.user_dense_dim, spec.item_dense_dim):
        raise ValueError(
            f"world dense dims ({cfg.user_dense_dim}, {cfg.item_dense_dim}) differ from the "
            f"spec's ({spec.user_dense_dim}, {spec.item_dense_dim})"
        )
    user = events.user_index
    stored_counts = world.user_recent_counts[user]
    stored_slots = np.arange(world.user_recent.shape[1])[None, :] < stored_counts[:, None]
    recent_counts, recent = merge_recent_items(
        events.recent_counts,
        events.recent_items,
        stored_counts,
        world.user_recent[user][stored_slots],
        spec.recent_items_cap,
    )

    items = events.candidate_items
    cols = FeatureColumns(
        user_ids=world.user_ids[user],
        device_ids=world.device_ids[events.device_index],
        country_ids=world.country_ids[events.country_index],
        candidate_counts=events.candidate_counts.astype(np.int64),
        candidate_ids=world.item_ids[items],
        recent_counts=recent_counts,
        recent_ids=world.item_ids[recent],
        user_dense=world.user_dense[user],
        item_category=world.item_category[items],
        item_dense=world.item_dense[items],
    )
    cols.validate(spec)
    return cols


def sample_labels(
    events: SampledEvents, world: SyntheticWorld, rng: np.random.Generator
) -> Float32Array:
    """Clicks (0/1) for every row, drawn from :meth:`SyntheticWorld.click_probability`.

    Args:
        events: the events.
        world: their world.
        rng: the generator to draw from.

    Returns:
        float32[R] labels, event-major like the candidates.

    Example::

        labels = sample_labels(events, world, np.random.default_rng(0))
    """
    return (rng.random(events.num_rows) < row_click_probability(events, world)).astype(np.float32)


def row_click_probability(events: SampledEvents, world: SyntheticWorld) -> Float64Array:
    """The true click probability of every row of ``events`` (float64[R])."""
    row_event = segment_ids(events.candidate_counts)
    return world.click_probability(
        events.user_index[row_event],
        events.candidate_items,
        events.device_index[row_event],
        events.country_index[row_event],
    )


def to_event_dicts(events: SampledEvents, world: SyntheticWorld) -> Iterator[dict[str, Any]]:
    """Yield the events in the Avro ``UserEvent`` shape.

    Fields: ``event_id`` (32 hex digits), ``user_id`` (long), ``event_time`` (epoch millis),
    ``context`` ``{"device": str, "country": str}``, ``candidate_item_ids`` (list of longs),
    ``recent_item_ids`` (list of longs, or ``None`` where the event has none), ``num_results``.

    Args:
        events: the events.
        world: their world.

    Returns:
        An iterator of plain dicts (ints are Python ints).

    Example::

        for record in to_event_dicts(events, world):
            producer.produce(topic, serialize(record))
    """
    cfg = world.config
    cand_split = offsets(events.candidate_counts)[1:-1]
    recent_split = offsets(events.recent_counts)[1:-1]
    candidates = np.split(world.item_ids[events.candidate_items], cand_split)
    recents = np.split(world.item_ids[events.recent_items], recent_split)
    user_ids = world.user_ids[events.user_index].tolist()
    times = events.event_time_ms.tolist()
    devices = [cfg.devices[d] for d in events.device_index.tolist()]
    countries = [cfg.countries[c] for c in events.country_index.tolist()]
    has_recent = events.has_recent.tolist()
    num_results = events.num_results.tolist()
    for e, event_id in enumerate(events.event_ids()):
        yield {
            "event_id": event_id,
            "user_id": user_ids[e],
            "event_time": times[e],
            "context": {"device": devices[e], "country": countries[e]},
            "candidate_item_ids": candidates[e].tolist(),
            "recent_item_ids": recents[e].tolist() if has_recent[e] else None,
            "num_results": num_results[e],
        }
