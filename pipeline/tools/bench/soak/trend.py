"""The soak's memory check: a slope, not two end points.

A 10-minute window where RSS grows 4% passes a "growth under 5%" check, yet that slope is
gigabytes a day. Instead, RSS after the warm-up is fitted with a line, reported in MiB per hour
and as the growth it projects over 24 hours (relative to the fitted RSS at the start of the
fit); the check passes when that projection stays under a bound (10%). The line is Theil-Sen's
(the median of the slopes between every two samples): one sample caught while a large batch's
memory was briefly mapped, or one step, does not tilt it; a steady climb, or steps that keep
coming, do.

A structure filling toward a fixed size (a cache whose pages are touched as its entries are
first written: the enricher's feature cache up to ``redis.cache_max_entries``) also makes RSS
climb, then stop. To tell that from a leak the samples after the warm-up are also fitted in two
halves: the **check uses the later half's slope** (what would go on), and the shape is named:

- ``growing``: the later half projects over the bound (a leak, or a fill or a step that has not
  settled yet: a longer run tells which); the check fails;
- ``flat``: the later half and the whole fit project under the bound;
- ``filling``: the later half does, the whole fit does not (the climb stopped within the run: a
  plateau).

Example::

    trend = rss_trend(times_s, rss_bytes, max_growth_24h=0.10)
    trend.passed, trend.as_dict()["mib_per_hour"]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Fit", "RssTrend", "fit_line", "rss_trend"]

MIB = 2**20
DAY_S = 86_400.0
MIN_SAMPLES = 3
"""Samples a fit needs (a half with fewer is not fitted)."""


@dataclass(frozen=True)
class Fit:
    """A Theil-Sen line ``bytes = intercept + slope * t`` over some samples.

    Attributes:
        start_s / end_s: the samples' time span.
        slope: bytes per second.
        intercept: bytes at ``t = 0``.
        samples: how many.
    """

    start_s: float
    end_s: float
    slope: float
    intercept: float
    samples: int

    def at(self, t_s: float) -> float:
        """The fitted RSS at ``t_s``."""
        return self.intercept + self.slope * t_s

    @property
    def mib_per_hour(self) -> float:
        """The slope in MiB per hour."""
        return self.slope * 3600 / MIB

    @property
    def growth_24h(self) -> float:
        """Projected growth over 24 h, a fraction of the fitted RSS at the fit's start."""
        base = self.at(self.start_s)
        return self.slope * DAY_S / base if base > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "from_s": self.start_s,
            "to_s": self.end_s,
            "samples": self.samples,
            "mib_per_hour": round(self.mib_per_hour, 2),
            "growth_24h": round(self.growth_24h, 4),
        }


def fit_line(times_s: Sequence[float], values: Sequence[float]) -> Fit | None:
    """Theil-Sen's line through ``(times_s, values)``: the median of the slopes between every
    two samples at different times, and the median intercept for it (``None``: fewer than
    :data:`MIN_SAMPLES` samples, or all at one time)."""
    t = np.asarray(times_s, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if len(t) < MIN_SAMPLES or np.ptp(t) <= 0:
        return None
    first, second = np.triu_indices(len(t), k=1)
    apart = t[second] != t[first]
    slopes = (y[second] - y[first])[apart] / (t[second] - t[first])[apart]
    slope = float(np.median(slopes))
    intercept = float(np.median(y - slope * t))
    return Fit(float(t[0]), float(t[-1]), slope, intercept, len(t))


@dataclass(frozen=True)
class RssTrend:
    """The fits and the verdict (see the module docstring).

    Attributes:
        whole: the fit over every sample given.
        earlier / later: the fits over the first and second half of the span.
        max_growth_24h: the bound.
    """

    whole: Fit | None
    earlier: Fit | None
    later: Fit | None
    max_growth_24h: float

    @property
    def checked(self) -> Fit | None:
        """The fit the check uses: the later half's (the whole's when it has too few
        samples)."""
        return self.later or self.whole

    @property
    def passed(self) -> bool:
        """The checked fit projects under the bound over 24 h."""
        checked = self.checked
        return checked is not None and checked.growth_24h < self.max_growth_24h

    @property
    def shape(self) -> str | None:
        """``flat``, ``filling`` or ``growing`` (``None``: nothing to fit)."""
        if self.whole is None:
            return None
        if not self.passed:
            return "growing"
        return "flat" if self.whole.growth_24h < self.max_growth_24h else "filling"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the checked slope, its 24 h projection, the shape and each fit."""
        checked = self.checked
        return {
            "mib_per_hour": None if checked is None else round(checked.mib_per_hour, 2),
            "growth_24h": None if checked is None else round(checked.growth_24h, 4),
            "max_growth_24h": self.max_growth_24h,
            "shape": self.shape,
            "fits": {
                name: None if fit is None else fit.as_dict()
                for name, fit in (
                    ("whole", self.whole),
                    ("earlier", self.earlier),
                    ("later", self.later),
                )
            },
        }


def rss_trend(
    times_s: Sequence[float], rss_bytes: Sequence[float], max_growth_24h: float
) -> RssTrend:
    """Fit RSS over the samples given (those after the warm-up, under load), whole and in
    halves of the time span.

    Args:
        times_s: sample times, ascending.
        rss_bytes: RSS at each.
        max_growth_24h: the bound on projected growth over 24 h (a fraction).

    Returns:
        The :class:`RssTrend`.
    """
    whole = fit_line(times_s, rss_bytes)
    if whole is None:
        return RssTrend(None, None, None, max_growth_24h)
    middle = (whole.start_s + whole.end_s) / 2
    first = [(t, r) for t, r in zip(times_s, rss_bytes, strict=True) if t <= middle]
    second = [(t, r) for t, r in zip(times_s, rss_bytes, strict=True) if t >= middle]
    earlier = fit_line([t for t, _ in first], [r for _, r in first])
    later = fit_line([t for t, _ in second], [r for _, r in second])
    return RssTrend(whole, earlier, later, max_growth_24h)
