"""Where each event's latency went: per-batch stage timings joined to per-event timestamps.

:class:`StageTrace` listens to a pipeline's own Prometheus metrics
(:class:`~pipeline.observability.metrics.Metrics`): every observation of
``streamrank_stage_duration_seconds{stage=...}`` and of ``streamrank_batch_rows`` is kept with
the wall-clock time it was made (the histograms themselves are untouched).

:func:`decompose` then splits each event's end-to-end latency, ``scored_at - event_time``
(``scored_at`` is when its batch's Recommendations were handed to the producer), into
:data:`COMPONENTS`, which sum to it:

- **kafka_in**: ``event_time`` -> the broker appended the event (input topic created with
  ``message.timestamp.type=LogAppendTime``): the producer's linger and its request.
- **behind**: from then until its batch closed (its ``enrich`` started), the time the loop was
  busy with earlier batches (their enrich, features, forward and produce stages): queueing
  behind work in front of it.
- **batching**: the rest of that wait, when the loop was *not* working on another batch: the
  consumer's fetch, polling, decoding, and the open batch waiting to fill or for
  ``max_delay_ms``.
- **prepare**: the ``enrich`` and ``features`` stages of its own batch.
- **forward**: the ``forward`` stage of its batch (forward and top-K on the scoring thread).
- **rest**: what is left (hand-offs between the stages); small.

An event's batch is the last forward that ended at or before its ``scored_at``; a batch's
enrich and features are the last ones that ended before that forward started. **queued** in the
reports is ``behind + batching``.

:class:`BatchCosts` keeps what the loop's batch policy learns from each batch (its rows and its
processing time, enrich to publish): the loop's busy share over a load, and the line
``fixed + per_row * rows`` through the batches (the per-batch fixed cost).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from pipeline.observability.metrics import Metrics

if TYPE_CHECKING:
    from pipeline.runtime.batch_policy import BatchPolicy

TRACED_STAGES = ("enrich", "features", "forward", "produce")
BUSY_STAGES = ("enrich", "features", "forward", "produce")
"""The stages of a batch; an event waiting while one of another batch runs waits "behind"."""
COMPONENTS = ("kafka_in", "behind", "batching", "prepare", "forward", "rest")


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


@dataclass
class BatchCosts:
    """Each batch's rows and processing seconds (enrich to publish) as the loop's batch policy
    observes them, with the wall-clock time it did (the batch's publish).

    Example::

        costs = BatchCosts.tap(pipeline.policy)
        pipeline.run(exit_when_idle_s=3)
        costs.line()["fixed_ms"], costs.busy_share(start, end)["mean"]
    """

    rows: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)

    @classmethod
    def tap(cls, policy: BatchPolicy) -> BatchCosts:
        """Keep every batch ``policy.observe`` is told about (the method is wrapped in place)."""
        costs = cls()
        observe = policy.observe

        def tapped(rows: int, seconds: float, now: float) -> None:
            costs.rows.append(rows)
            costs.seconds.append(seconds)
            costs.ends.append(time.time())
            observe(rows, seconds, now)

        policy.observe = tapped  # type: ignore[method-assign]
        return costs

    def line(self) -> dict[str, Any]:
        """The least-squares line ``fixed + per_row * rows`` through every batch: ``fixed_ms``
        (the per-batch fixed cost), ``per_row_us``, the batches and their rows' spread
        (``rows_p10``, ``rows_p90``: a line through batches of one size says little), and
        ``processing_ms`` quantiles. NaN when fewer than two sizes were seen."""
        rows = np.asarray(self.rows, dtype=np.float64)
        seconds = np.asarray(self.seconds, dtype=np.float64)
        out: dict[str, Any] = {"batches": len(rows), "processing_ms": quantiles_ms(seconds * 1000)}
        if len(rows) < 2 or np.ptp(rows) == 0:
            return {**out, "fixed_ms": float("nan"), "per_row_us": float("nan")}
        per_row, fixed = np.polyfit(rows, seconds, 1)
        p10, p90 = np.quantile(rows, [0.1, 0.9])
        return {
            **out,
            "fixed_ms": round(float(fixed) * 1000, 2),
            "per_row_us": round(float(per_row) * 1e6, 2),
            "rows_p10": round(float(p10)),
            "rows_p90": round(float(p90)),
        }

    def busy_share(self, start: float, end: float) -> dict[str, float]:
        """The share of ``[start, end]`` (wall seconds) the loop spent processing batches:
        ``mean``, and over each second of it (the last one as long as what is left),
        ``p90_1s`` and ``max_1s``."""
        if end <= start:
            return {"mean": float("nan"), "p90_1s": float("nan"), "max_1s": float("nan")}
        ends = np.asarray(self.ends, dtype=np.float64)
        starts = ends - np.asarray(self.seconds, dtype=np.float64)
        edges = np.append(np.arange(start, end, 1.0), end)
        lo = np.maximum(starts[:, None], edges[None, :-1])
        hi = np.minimum(ends[:, None], edges[None, 1:])
        per_bin = np.clip(hi - lo, 0.0, None).sum(axis=0)
        widths = np.diff(edges)
        kept = widths > 1e-9
        shares = per_bin[kept] / widths[kept]
        return {
            "mean": round(float(per_bin.sum() / (end - start)), 3),
            "p90_1s": round(float(np.quantile(shares, 0.9)), 3),
            "max_1s": round(float(shares.max()), 3),
        }


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


class BusyTime:
    """How much of a time range the loop spent in :data:`BUSY_STAGES` (their union).

    Args:
        trace: the run's stage observations.
    """

    def __init__(self, trace: StageTrace) -> None:
        spans: list[tuple[float, float]] = []
        for name in BUSY_STAGES:
            ends, secs = trace.stages[name].arrays()
            spans.extend(zip((ends - secs).tolist(), ends.tolist(), strict=True))
        merged: list[list[float]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        bounds = np.asarray(merged, dtype=np.float64).reshape(-1, 2)
        self._starts, self._ends = bounds[:, 0], bounds[:, 1]
        self._before = np.concatenate([[0.0], np.cumsum(self._ends - self._starts)])

    def until(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Busy seconds before each time in ``t``."""
        if not len(self._starts):
            return np.zeros_like(t)
        k = np.searchsorted(self._starts, t, side="right")  # spans started by t
        last = np.maximum(k - 1, 0)
        partial = np.clip(t - self._starts[last], 0.0, self._ends[last] - self._starts[last])
        return np.where(k > 0, self._before[last] + partial, 0.0)

    def between(self, lo: npt.NDArray[np.float64], hi: npt.NDArray[np.float64]) -> npt.NDArray:
        """Busy seconds within each ``[lo, hi]``."""
        return np.maximum(self.until(hi) - self.until(lo), 0.0)


def _per_batch(
    trace: StageTrace, name: str, forward_starts: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per forward, (start, seconds) of the last ``name`` stage that ended before it started
    (NaN, 0 when none)."""
    ends, secs = trace.stages[name].arrays()
    if not len(ends):
        return np.full(len(forward_starts), np.nan), np.zeros(len(forward_starts))
    k = _last_before(ends, forward_starts)
    ok = k >= 0
    pick = np.maximum(k, 0)
    return np.where(ok, ends[pick] - secs[pick], np.nan), np.where(ok, secs[pick], 0.0)


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
    n = len(event_time_ms)
    e2e = (scored_at_ms - event_time_ms).astype(np.float64)
    kafka_in = np.clip((appended_ms - event_time_ms).astype(np.float64), 0.0, e2e)
    f_ends, f_secs = trace.stages["forward"].arrays()
    # scored_at is whole milliseconds taken after the forward ended: compare in whole ms.
    batch = _last_before(np.floor(f_ends * 1000), scored_at_ms.astype(np.float64))
    zeros = np.zeros(n)
    forward, prepare, behind, batching = zeros, zeros.copy(), zeros, zeros
    if len(f_secs):
        matched, pick = batch >= 0, np.maximum(batch, 0)
        forward = np.where(matched, f_secs[pick] * 1000, 0.0)
        f_starts = f_ends - f_secs
        enrich_start, enrich_s = _per_batch(trace, "enrich", f_starts)
        _, features_s = _per_batch(trace, "features", f_starts)
        prepare = np.where(matched, (enrich_s + features_s)[pick] * 1000, 0.0)
        closed = np.where(np.isnan(enrich_start), f_starts, enrich_start)[pick]  # batch closed
        arrived = appended_ms / 1000.0
        waited = np.where(matched, np.maximum(closed - arrived, 0.0), 0.0) * 1000
        behind = np.minimum(BusyTime(trace).between(arrived, closed) * 1000, waited)
        behind = np.where(matched, behind, 0.0)
        batching = waited - behind
    rest = e2e - kafka_in - behind - batching - prepare - forward
    return Decomposition(
        e2e=e2e,
        components={
            "kafka_in": kafka_in,
            "behind": behind,
            "batching": batching,
            "prepare": prepare,
            "forward": forward,
            "rest": rest,
        },
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
