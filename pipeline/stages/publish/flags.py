"""Which feature groups of each event fell back to defaults (``fallback_features``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from model.features.segments import starts
from pipeline.types import Enrichment, EventColumns, FallbackFeature

__all__ = ["FALLBACK_NAMES", "FALLBACK_OFFSETS", "FallbackFlags", "fallback_flags"]

FALLBACK_NAMES = np.frombuffer(
    (FallbackFeature.USER.value + FallbackFeature.ITEM.value).encode(), dtype=np.uint8
)
"""The two names, UTF-8, back to back (user, then item)."""
FALLBACK_OFFSETS = np.array(
    [0, len(FallbackFeature.USER.value), len(FALLBACK_NAMES)], dtype=np.int64
)


@dataclass
class FallbackFlags:
    """Per event: which feature groups fell back to defaults (``fallback_features``)."""

    user: npt.NDArray[np.bool_]
    item: npt.NDArray[np.bool_]


def fallback_flags(events: EventColumns, enrichment: Enrichment) -> FallbackFlags:
    """Per-event flags; an event's item flag is set when any of its candidates fell back."""
    event_starts = starts(events.candidate_counts)
    item_any = (
        np.logical_or.reduceat(enrichment.item_missing, event_starts)
        if len(event_starts)
        else event_starts
    )
    return FallbackFlags(user=enrichment.user_missing.copy(), item=item_any.astype(bool))
