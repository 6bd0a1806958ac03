"""The signals the autoscaler decides on, as plain data: short histories read from Prometheus.

A signal is a `Series` of (unix time, value) points with the query that produced it. A series
without points is "no data" and says why in `problem`; NaN and infinite values never become
points, so no data is never mistaken for zero.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

from infertune.api.units import parse_duration


@lru_cache(maxsize=1024)
def seconds(duration: str) -> float:
    """Duration.seconds, cached: it parses the text on every access, and a cycle over 1000
    tunings reads each duration several times per tuning."""
    return float(parse_duration(duration))


@dataclass(frozen=True)
class Series:
    """Points of one signal for one target, oldest first, `step` seconds apart."""

    points: tuple[tuple[float, float], ...] = ()
    step: float = 1.0
    query: str = ""
    problem: str | None = None
    """Why there is no data (no series, NaN, stale, Prometheus unreachable), for conditions."""

    @classmethod
    def missing(cls, problem: str, query: str = "") -> Series:
        return cls(points=(), query=query, problem=problem)

    @classmethod
    def of(cls, points: list[tuple[float, float]], step: float, query: str = "") -> Series:
        """A series from raw points; NaN and +-Inf are dropped (they are no data, not zero)."""
        finite = tuple((t, v) for t, v in points if math.isfinite(v))
        if not finite:
            return cls.missing("only NaN or infinite values", query)
        return cls(points=finite, step=step, query=query)

    @property
    def available(self) -> bool:
        return bool(self.points)

    def latest(self, now: float) -> float | None:
        """The newest value if it is recent (within one step of `now`), else None."""
        if not self.points:
            return None
        t, value = self.points[-1]
        return value if t >= now - self.step - 1.0 else None

    def since(self, start: float) -> tuple[tuple[float, float], ...]:
        return tuple(p for p in self.points if p[0] >= start)

    def value_at(self, t: float) -> float | None:
        """The value of the point nearest to `t`, if one lies within half a step of it."""
        best = min(self.points, key=lambda p: abs(p[0] - t), default=None)
        if best is None or abs(best[0] - t) > self.step / 2 + 0.5:
            return None
        return best[1]

    def covers(self, start: float, end: float) -> bool:
        """True when points span [start, end] without a gap longer than 1.5 steps."""
        inside = [t for t, _ in self.points if start - self.step <= t <= end + self.step]
        if not inside or inside[0] > start + self.step or inside[-1] < end - self.step - 1.0:
            return False
        return all(b - a <= 1.5 * self.step + 0.5 for a, b in itertools.pairwise(inside))


NOT_FETCHED = Series.missing("not fetched")


@dataclass(frozen=True)
class TargetSignals:
    """Everything the engine reads for one InferenceTuning."""

    queue: Series
    """Mean requests waiting per replica, at a fine step over the queue's sustain window."""

    latency: Series
    """The latency quantile in seconds, one point per evaluation interval."""

    request_rate: Series
    """Requests per second across the target, at the same times as `latency`."""

    running: Series = NOT_FETCHED
    """Mean requests being served per replica (the batch actually run), for batching."""

    latency_kind: str = "p99"
    """What `latency` is: a quantile such as p99, or "mean" where the engine has no histogram."""

    def problems(self) -> tuple[str, ...]:
        named = (("queue", self.queue), ("latency", self.latency),
                 ("requestRate", self.request_rate))
        return tuple(f"{name}: {s.problem}" for name, s in named if s.problem is not None)
