"""The signals the autoscaler decides on, as plain data read from Prometheus.

Latency and request rate are a `Series` of (unix time, value) points, one per evaluation
interval. The queue and the running requests are a `Window`: their trailing sustain window
summed up by Prometheus itself (`*_over_time` subqueries), because a point per second for every
tuning is most of what a cycle would otherwise read. Either one without data says why in
`problem`; NaN and infinite values never count as data, so no data is never mistaken for zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from infertune.api.units import duration_seconds

ONLY_NAN = "only NaN or infinite values"
"""The problem of a signal whose every point was NaN or infinite (no data, not zero)."""
NEGATIVE = ("a negative value, which no queue, latency or request rate can be: the query is "
            "wrong (a PromQL template's delta() or subtraction?)")
"""The problem of a signal with a negative value (no data: taken as it is, a queue of -1
scaled the Deployment in)."""
STALE = "stale: "
"""How the problem of a series whose newest sample is too old starts."""
FLOAT_NOISE = 1e-9
"""Far below one replica or one batch slot, above the rounding error of the ratios they are
sized from: 3 x 100ms / 75ms is 4.000000000000001, and 128 x (0.075 / 0.1) is 95.99...: both
are rounded after taking it off (or adding it)."""


seconds = duration_seconds
"""Duration.seconds of a duration's text, cached (units.duration_seconds): the rules read the
spec's durations as text."""


_PLACES = tuple(f".{n}f" for n in range(11))
"""format() specs by number of decimals (building the spec in an f-string costs more)."""


def distinct(value: float, boundary: float, places: int, noise: float = 0.0) -> str:
    """`value` to `places` decimals, or to as many more (up to 10) as it takes not to read as
    `boundary` when it is not: a reason must not say "75ms vs target 75ms" and scale out, or
    "ratio 1.10, within tolerance 0.1" for one ratio and "ratio 1.10, above" for the next.
    Within `noise` of it, it is the boundary, for a rule that compares them so (the queue's
    tolerance, with FLOAT_NOISE): a queue of 3.3 per replica against a target of 3 read
    "ratio 1.100000, within tolerance 0.1"."""
    text = format(value, _PLACES[places])
    if abs(value - boundary) <= noise or text != format(boundary, _PLACES[places]):
        return text  # the usual case: they differ at `places` already
    for more in range(places + 1, len(_PLACES)):
        text = format(value, _PLACES[more])
        if text != format(boundary, _PLACES[more]):
            break
    return text


def amount_text(value: float, boundary: float, places: int = 1) -> str:
    """A count or rate compared with `boundary` (a target, a minimum): `places` decimals as
    `distinct` gives them, or two significant digits under 0.1, where decimals read as 0 ("queue
    0.0/replica vs target 0.01 (ratio 1.40)", "0.00 req/s is below minRequestRate 0.005")."""
    if 0 < abs(value) < 0.1:
        text = format(value, ".2g")
        return text if text != format(boundary, ".2g") or value == boundary else \
            format(value, ".6g")
    return distinct(value, boundary, places)


def latency_text(latency_s: float, target_s: float | None = None) -> str:
    """A latency in milliseconds to a tenth, or finer where it would read as `target_s`."""
    ms = latency_s * 1000
    text = format(ms, ".1f") if target_s is None else distinct(ms, target_s * 1000, 1)
    return (text[:-2] if text.endswith(".0") else text) + "ms"


class Series(NamedTuple):
    """Points of one signal for one target, oldest first, `step` seconds apart.

    Series and Window are named tuples: immutable like frozen dataclasses, and several times
    cheaper to build, which counts at a few thousand per evaluation cycle.
    """

    points: tuple[tuple[float, float], ...] = ()
    step: float = 1.0
    query: str = ""
    problem: str | None = None
    """Why there is no data (no series, NaN, stale, Prometheus unreachable), for conditions."""

    @classmethod
    def missing(cls, problem: str, query: str = "") -> Series:
        return cls(points=(), query=query, problem=problem)

    @classmethod
    def of(cls, points: Iterable[tuple[float, float]], step: float, query: str = "") -> Series:
        """A series from raw points; NaN and +-Inf are dropped (they are no data, not zero)."""
        isfinite = math.isfinite
        finite = tuple([p for p in points if isfinite(p[1])])
        if not finite:
            return cls.missing(ONLY_NAN, query)
        return cls(finite, step, query)

    @property
    def available(self) -> bool:
        return bool(self.points)

    def latest(self, now: float) -> float | None:
        """The newest value if it is recent (within one step of `now`), else None."""
        if not self.points:
            return None
        t, value = self.points[-1]
        return value if t >= now - self.step - 1.0 else None

    def value_at(self, t: float) -> float | None:
        """The value of the point nearest to `t`, if one lies within half a step of it."""
        best, distance = None, math.inf
        for at, value in self.points:  # a handful of points: a loop beats min() with a key
            if abs(at - t) < distance:
                best, distance = value, abs(at - t)
        return best if distance <= self.step / 2 + 0.5 else None


class Window(NamedTuple):
    """A gauge over the trailing `span` seconds ending at `end`, sampled every `step` seconds.

    `last` is the value at `end`. For the queue, `dip` is the newest step in the window at or
    below `threshold` (None when there is none), only read while `last` is above it;
    `samples` counts the steps with finite data (Prometheus says it only for a window short
    of `expected_samples`, and the adapter takes a full one otherwise); `rise` is the newest
    step above `threshold` (None when there is none), read while `last` is at or below it.
    For running requests, `peak` is the highest step in the window.
    """

    last: float | None = None
    end: float = 0.0
    span: float = 0.0
    step: float = 1.0
    threshold: float | None = None
    dip: float | None = None
    samples: int = 0
    peak: float | None = None
    query: str = ""
    problem: str | None = None
    pods: int | None = None
    """How many pods report the queue now with a value below +Inf (`last` is their mean), or
    for the running requests how many series do; None when not read."""
    rise: float | None = None

    @classmethod
    def missing(cls, problem: str, query: str = "") -> Window:
        return cls(query=query, problem=problem)

    @classmethod
    def of_points(cls, points: Sequence[tuple[float, float]], end: float, span: float,
                  step: float, threshold: float | None = None, query: str = "",
                  pods: int | None = None) -> Window:
        """The window Prometheus computes from raw points at `step` (the queries in promql.py
        mean exactly this): steps in [end - span, end], NaN and infinities left out."""
        inside = [(t, v) for t, v in points if end - span <= t <= end and math.isfinite(v)]
        if not inside or inside[-1][0] != end:
            return cls.missing(ONLY_NAN if points else "no data", query)
        last = inside[-1][1]
        dips = [t for t, v in inside if threshold is not None and v <= threshold]
        return cls(last=last, end=end, span=span, step=step, threshold=threshold,
                   dip=max(dips, default=None), samples=len(inside),
                   peak=max(v for _, v in inside), query=query, pods=pods,
                   rise=max((t for t, v in inside if threshold is not None and v > threshold),
                            default=None))

    @property
    def available(self) -> bool:
        return self.last is not None

    def latest(self, now: float) -> float | None:
        """`last` if the window ends within one step (and a second) of `now`, else None."""
        if self.last is None or self.end < now - self.step - 1.0:
            return None
        return self.last

    @property
    def complete(self) -> bool:
        """The window has the steps of a full one, but one on Prometheus 2 (expected_samples):
        without a step, a value in it is not known."""
        return self.samples >= self.expected_samples

    @property
    def expected_samples(self) -> int:
        return full_window_steps(self.span, self.step)


def full_window_steps(span_s: float, step_s: float) -> int:
    """Steps a window without gaps has, give or take the step on its open left edge
    (Prometheus 3 leaves it out, 2 counts it): one missing step is tolerated, as a single
    skipped scrape is. The window query returns `samples` only under it
    (promql.window_query), and the adapter takes an absent one for it."""
    return int(span_s // step_s)


NOT_FETCHED = Series.missing("not fetched")
NOT_FETCHED_WINDOW = Window.missing("not fetched")
NOT_READ = Window.missing("not read: batching is Off or the engine has no running gauge")


class TargetSignals(NamedTuple):
    """Everything the engine reads for one InferenceTuning (a named tuple: one per tuning per
    cycle)."""

    queue: Window
    """Mean requests waiting per replica, over the queue's sustain window."""

    latency: Series
    """The latency quantile in seconds, one point per evaluation interval."""

    request_rate: Series
    """Requests per second across the target, at the same times as `latency`."""

    running: Window = NOT_FETCHED_WINDOW
    """Mean requests being served per replica (the batch actually run), for batching."""

    latency_kind: str = "p99"
    """What `latency` is: a quantile such as p99, or "mean" where the engine has no histogram."""

    latency_floor_s: float | None = None
    """The lowest finite bucket bound of the latency histogram, None when not known: a
    quantile at or under it only says the latency is at most that."""

    latency_floor_unknown: bool = False
    """The latency is a preset's histogram whose bounds could not be read (the read failed,
    or did not answer in time): a quantile under the lowest bound cannot be told from a real
    one, so the latency is not compared with the target until they are."""

    read_at: float | None = None
    """The time the signals were read for (the batch's fetch); None: the evaluation's own.
    A tuning whose pass ran later in the slot reads the batch fetched at its start: its
    signals are as fresh as that fetch, not stale by the time the pass waited."""

    latency_window_s: float = 0.0
    """How far back each latency sample reaches (spec.metrics.window): a sample taken less
    than this after the replicas changed still holds requests served before."""

    latency_floor_problem: str = ""
    """Why the bounds are not known (with `latency_floor_unknown`), for MetricsAvailable:
    the read's failure, or that it found none for this target, and the query."""

    warnings: tuple[str, ...] = ()
    """What Prometheus warned of with the answers these signals come from (a remote read
    that failed or a partial response, so the data may be incomplete; a PromQL warning), for
    MetricsAvailable."""

    def fresh_at(self, now: float) -> float:
        """The time the signals are judged fresh at, for an evaluation at `now`: when they
        were read, or `now` (not given, or a clock that stepped back since)."""
        return now if self.read_at is None or self.read_at > now else self.read_at

    def problems(self) -> tuple[str, ...]:
        if (self.queue.problem is None and self.latency.problem is None
                and self.request_rate.problem is None):
            return ()  # the usual case, without building the list below
        named: tuple[tuple[str, Series | Window], ...] = (
            ("queue", self.queue), ("latency", self.latency), ("requestRate", self.request_rate))
        # With the query that found nothing for this target, ready to paste into Prometheus
        # (it is stable, so the condition still changes only with the situation).
        return tuple(f"{name}: {s.problem}" + (f" (query: {s.query})" if s.query else "")
                     for name, s in named if s.problem is not None)
