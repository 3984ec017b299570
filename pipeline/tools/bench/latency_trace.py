"""Where each event's latency went: per-batch stage timings joined to per-event timestamps.

:class:`StageTrace` listens to a pipeline's own Prometheus metrics
(:class:`~pipeline.metrics.Metrics`): every observation of
``streamrank_stage_duration_seconds{stage=...}`` and of ``streamrank_batch_rows`` is kept with
the wall-clock time it was made (the histograms themselves are untouched).

:func:`decompose` then splits each event's end-to-end latency, ``scored_at - event_time``
(``scored_at`` is when its batch's Recommendations were handed to the producer), into:

- **kafka_in**: ``event_time`` -> the broker appended the event (input topic created with
  ``message.timestamp.type=LogAppendTime``): the producer's linger and its request.
- **forward**: the ``forward`` stage of the event's batch (forward and top-K on the scoring
  thread). The event's batch is the last forward that ended at or before ``scored_at``.
- **prepare**: the ``enrich`` and ``features`` stages of that batch (the last of each that
  ended before the forward started).
- **queued**: the rest: fetched by the consumer, waiting while the loop scored earlier batches,
  waiting in the open batch until it closed (``max_delay_ms`` or full), and the event's share
  of decode and encode (per chunk, small).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.metrics import Metrics

TRACED_STAGES = ("enrich", "features", "forward")
COMPONENTS = ("kafka_in", "queued", "prepare", "forward")


@dataclass
class Observations:
    """The observations of one histogram: wall-clock end (s) and value, in order."""

    ends: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.ends.append(time.time())
        self.values.append(value)

    def arrays(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        return np.asarray(self.ends, dtype=np.float64), np.asarray(self.values, dtype=np.float64)


class StageTrace:
    """Keeps every stage and batch-rows observation a pipeline makes (see module docstring).

    Args:
        metrics: the pipeline's metrics; its histograms' ``observe`` are wrapped in place.

    Example::

        metrics = Metrics()
        trace = StageTrace(metrics)
        ScoringPipeline(settings, scorer, metrics).run(exit_when_idle_s=3)
        ends, seconds = trace.stages["forward"].arrays()
    """

    def __init__(self, metrics: Metrics) -> None:
        self.stages = {name: Observations() for name in TRACED_STAGES}
        self.batch_rows = Observations()
        for name, kept in self.stages.items():
            _tap(metrics.stage_seconds.labels(stage=name), kept)
        _tap(metrics.batch_rows, self.batch_rows)


def _tap(histogram: Any, kept: Observations) -> None:
    observe = histogram.observe

    def tapped(value: float, *args: Any, **kwargs: Any) -> None:
        kept.add(value)
        observe(value, *args, **kwargs)

    histogram.observe = tapped


@dataclass
class Decomposition:
    """Per event (aligned with the inputs of :func:`decompose`), milliseconds.

    Attributes:
        e2e: ``scored_at - event_time``.
        components: :data:`COMPONENTS` -> per-event milliseconds; they sum to ``e2e``.
        batch: index of the event's batch (its forward), -1 when none matched.
    """

    e2e: npt.NDArray[np.float64]
    components: dict[str, npt.NDArray[np.float64]]
    batch: npt.NDArray[np.int64]

    def shares(self, mask: npt.NDArray[np.bool_] | None = None) -> dict[str, float]:
        """Each component's share of the summed latency of the events in ``mask`` (all)."""
        pick = np.ones(len(self.e2e), dtype=bool) if mask is None else mask
        total = float(self.e2e[pick].sum())
        if total <= 0:
            return dict.fromkeys(COMPONENTS, 0.0)
        return {k: round(float(v[pick].sum()) / total, 3) for k, v in self.components.items()}

    def means_ms(self, mask: npt.NDArray[np.bool_] | None = None) -> dict[str, float]:
        """Each component's mean over the events in ``mask`` (all), milliseconds."""
        pick = np.ones(len(self.e2e), dtype=bool) if mask is None else mask
        if not pick.any():
            return dict.fromkeys(COMPONENTS, 0.0)
        return {k: round(float(v[pick].mean()), 2) for k, v in self.components.items()}


def _last_before(ends: npt.NDArray[np.float64], times: npt.NDArray[np.float64]) -> npt.NDArray:
    """Per time, the index of the last end at or before it (-1 when none)."""
    return np.searchsorted(ends, times, side="right") - 1


def decompose(
    trace: StageTrace,
    event_time_ms: npt.NDArray[np.int64],
    scored_at_ms: npt.NDArray[np.int64],
    appended_ms: npt.NDArray[np.int64],
) -> Decomposition:
    """Split each event's latency into :data:`COMPONENTS` (see the module docstring).

    Args:
        trace: the run's stage observations.
        event_time_ms: per event, its ``event_time``.
        scored_at_ms: per event, its Recommendation's ``scored_at``.
        appended_ms: per event, when the broker appended it to the input topic.

    Returns:
        The per-event :class:`Decomposition`.
    """
    e2e = (scored_at_ms - event_time_ms).astype(np.float64)
    f_ends, f_secs = trace.stages["forward"].arrays()
    # scored_at is whole milliseconds taken after the forward ended: compare in whole ms.
    batch = _last_before(np.floor(f_ends * 1000), scored_at_ms.astype(np.float64))
    matched = batch >= 0
    forward = np.zeros(len(e2e))
    prepare = np.zeros(len(e2e))
    if len(f_secs):
        forward = np.where(matched, f_secs[np.maximum(batch, 0)] * 1000, 0.0)
        starts = f_ends - f_secs
        for name in ("enrich", "features"):
            ends, secs = trace.stages[name].arrays()
            if not len(ends):
                continue
            before = _last_before(ends, starts)
            per_batch = np.where(before >= 0, secs[np.maximum(before, 0)] * 1000, 0.0)
            prepare += np.where(matched, per_batch[np.maximum(batch, 0)], 0.0)
    kafka_in = np.clip((appended_ms - event_time_ms).astype(np.float64), 0.0, e2e)
    queued = e2e - kafka_in - prepare - forward
    return Decomposition(
        e2e=e2e,
        components={"kafka_in": kafka_in, "queued": queued, "prepare": prepare, "forward": forward},
        batch=batch.astype(np.int64),
    )


def quantiles_ms(values: npt.NDArray[np.float64]) -> dict[str, float]:
    """p50, p95, p99, max and mean of ``values`` (ms), rounded; NaN when empty."""
    if not len(values):
        return dict.fromkeys(("p50", "p95", "p99", "max", "mean"), float("nan"))
    p50, p95, p99 = np.quantile(values, [0.5, 0.95, 0.99])
    return {
        "p50": round(float(p50), 1),
        "p95": round(float(p95), 1),
        "p99": round(float(p99), 1),
        "max": round(float(values.max()), 1),
        "mean": round(float(values.mean()), 1),
    }
