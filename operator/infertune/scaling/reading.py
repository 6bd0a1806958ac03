"""Read the signal histories against the spec: current values, sustain and consecutive breaches.

Both rules are evaluated from the history Prometheus returns, never from memory, so a restarted
operator sees exactly what one that kept running would.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from infertune.api.scaling import AutoscalingSpec
from infertune.scaling.signals import (
    FLOAT_NOISE,
    ONLY_NAN,
    STALE,
    Series,
    TargetSignals,
    Window,
    latency_text,
    seconds,
)


class Reading(NamedTuple):
    """What the signals say at `now`, in the units of the spec (a named tuple: one is built
    per tuning per cycle)."""

    queue_per_replica: float | None
    queue_above_for_s: float
    """How long the queue has stayed above target without a break, up to the sustain window."""
    queue_sustained: bool
    latency_s: float | None
    latency_kind: str
    request_rate: float | None
    breaches: int
    """Consecutive latency samples above target with enough requests behind them."""
    latency_breached: bool
    latency_quiet: bool
    """Too few requests for the quantile to mean anything; not a missing signal."""
    running_per_replica: float | None
    running_peak: float | None
    problems: tuple[str, ...]
    queue_pods: int | None = None
    """How many pods report the queue now (`queue_per_replica` is their mean); None when not
    known."""
    ready_replicas: int | None = None
    """The Deployment's status.readyReplicas, read with its replicas; None when not known (a
    preview without a cluster)."""
    latency_floor_s: float | None = None
    """Set when the latency lies under the histogram's lowest bucket bound and the target is
    below that bound: the latency is then only known to be at most this, and cannot be
    compared with the target (no breach, no opinion)."""
    latency_bounds_unknown: bool = False
    """The histogram's bucket bounds could not be read (TargetSignals.latency_floor_unknown):
    the latency is not compared with the target either."""
    ready_pods: int | None = None
    """The Deployment's readyReplicas as the kubelet counts them, where `ready_replicas` is
    the count taken for serving instead (a container without a readiness probe); None: the
    same as `ready_replicas`."""
    latency_settled: bool = True
    """The newest latency sample was measured on the replicas there are now: its window
    starts after they last changed (`settled_at`)."""
    latency_requests: float | None = None
    """About how many requests the newest latency sample is a quantile of (the request rate
    over the window); None when the window or the rate is not known."""
    latency_backlog: str | None = None
    """Why a latency above target for `consecutiveSamples` is not taken for a breach
    (`latency_breached` is False): it is a backlog's the replicas drain (engine.decide_scale).
    None otherwise."""
    warnings: tuple[str, ...] = ()
    """What Prometheus warned of with the answers the signals come from
    (TargetSignals.warnings): the decision is taken on them as they are."""
    queue_above_ago_s: float | None = None
    """How long ago the queue per replica was last above its target in the sustain window,
    while it is at or below it now, where that was on the pods that serve now (after
    `settled_at`: the queue of fewer replicas, before a scale-out, says nothing of the load on
    these); None when it was not (or with a sustain of 0). The queue is then not low
    (`queue_is_low`)."""
    queue_steps: int | None = None
    """The steps with data in the queue's sustain window when it has fewer than a full one (a
    scrape that failed on every pod, a history shorter than the window), while the queue is
    at or below its target now; None when it is full (or with a sustain of 0). The queue is
    not known low then (`queue_is_low`): the steps above target may be the missing ones, as
    scrapes time out under load."""

    @property
    def queue_missing(self) -> bool:
        return self.queue_per_replica is None

    @property
    def latency_missing(self) -> bool:
        return self.latency_s is None and not self.latency_quiet

    def to_json(self) -> dict[str, Any]:
        return {
            "queuePerReplica": self.queue_per_replica,
            "queueAboveTargetForSeconds": self.queue_above_for_s,
            "queueSustained": self.queue_sustained,
            "latencySeconds": self.latency_s,
            "latencyKind": self.latency_kind,
            "requestRate": self.request_rate,
            "latencyBreaches": self.breaches,
            "latencyBreached": self.latency_breached,
            "latencyQuiet": self.latency_quiet,
            "runningPerReplica": self.running_per_replica,
            "queuePods": self.queue_pods,
            "readyReplicas": self.ready_replicas,
            "latencyFloorSeconds": self.latency_floor_s,
            "latencyBoundsUnknown": self.latency_bounds_unknown,
            "latencyBacklog": self.latency_backlog,
            "queueAboveTargetSecondsAgo": self.queue_above_ago_s,
            "queueWindowSteps": self.queue_steps,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
        }


def read_signals(spec: AutoscalingSpec, signals: TargetSignals, now: float,
                 ready: int | None = None, settled_at: float | None = None) -> Reading:
    """`settled_at`: since when the replicas have been as they are (engine._settled_at); a
    latency sample whose window reaches back before it is not counted as a breach."""
    # Fresh as of the fetch they come from: a pass later in the slot reads the slot's batch.
    read_at = signals.fresh_at(now)
    queue_now = signals.queue.latest(read_at)
    above_for, sustained = _queue_sustain(spec, signals, read_at, queue_now)
    latency_now = signals.latency.latest(read_at)
    rate_now = signals.request_rate.latest(read_at)
    floor = _floor_above_target(spec, signals)
    # No requests at all is quiet too: with minRequestRate 0 the NaN quantile of an idle
    # Deployment read as a missing signal, which held every scale-in for as long.
    quiet = rate_now is not None and (rate_now < spec.latency.min_request_rate
                                      or rate_now <= 0)
    unknown = signals.latency_floor_unknown and latency_now is not None and not quiet
    breaches = 0 if unknown else _consecutive_breaches(spec, signals, floor, settled_at)
    problems = signals.problems()
    if unknown:
        problems = (*problems, (
            "latency: the bucket bounds of the latency histogram could not be read, so the "
            f"{signals.latency_kind} may be an artefact of its lowest bucket; it is compared "
            "with the target once they are (read again every minute)"
            + (f": {signals.latency_floor_problem}" if signals.latency_floor_problem else "")))
    if queue_now is None or latency_now is None or rate_now is None:
        problems = (*problems, *_too_old(signals, queue_now, latency_now, rate_now))
    unjudged = None
    if floor is not None and latency_now is not None and not quiet:
        if latency_now <= floor + FLOAT_NOISE:
            unjudged = floor
        # Said whether or not this reading is under it (the same words either way): said
        # only then, MetricsAvailable flapped at every interval with a P99 around the bound.
        problems = (*problems, (
            f"{FLOOR_PROBLEM} {latency_text(floor)}, above the target {spec.latency.target}, "
            f"so a {signals.latency_kind} under it cannot be compared with the target; set "
            f"latency.target to {latency_text(floor)} or more, or export the histogram with "
            "finer buckets (spec.metrics)"))
    if quiet and (signals.latency.problem == ONLY_NAN
                  or str(signals.latency.problem).startswith(STALE)):
        # Without requests the quantile is NaN (0/0): quiet traffic, not a missing signal;
        # the request rate, from the same histogram, shows the series are there. Just after
        # traffic stops, the NaN newest point is dropped and the finite one before it reads
        # as stale.
        problems = tuple(p for p in problems if not p.startswith("latency: "))
    return Reading(  # positional: one per tuning per cycle, and keywords cost more
        queue_now, above_for, sustained, None if quiet else latency_now, signals.latency_kind,
        rate_now, breaches, breaches >= spec.latency.consecutive_samples, quiet,
        signals.running.latest(read_at),
        signals.running.peak if signals.running.available else None,
        problems, signals.queue.pods if queue_now is not None else None, ready, unjudged,
        unknown, None, settled_at is None or (
            bool(signals.latency.points)
            and signals.latency.points[-1][0] >= settled_at + signals.latency_window_s),
        None if rate_now is None or not signals.latency_window_s
        else rate_now * signals.latency_window_s, None, signals.warnings,
        *_not_known_low(spec, signals.queue, queue_now, settled_at))


def _not_known_low(spec: AutoscalingSpec, window: Window, queue_now: float | None,
                   settled_at: float | None) -> tuple[float | None, int | None]:
    """(Reading.queue_above_ago_s, Reading.queue_steps) from the queue's window: both None
    unless the queue is at or below its target now."""
    if (queue_now is None or window.threshold is None
            or queue_now > spec.queue.target_per_replica):
        return None, None
    rise = window.rise
    above_ago = (None if rise is None or (settled_at is not None and rise < settled_at)
                 else max(window.end - rise, 0.0))
    return above_ago, None if window.complete else window.samples


def _too_old(signals: TargetSignals, queue: float | None, latency: float | None,
             rate: float | None) -> tuple[str, ...]:
    """The problems of signals that have data but none recent enough for the time they were
    read for: no data, and said so, rather than a reason of "no data" under
    MetricsAvailable=True. Worded without the time, so that the condition does not change at
    every evaluation while it lasts."""
    out = []
    named: tuple[tuple[str, Window | Series, float | None], ...] = (
        ("queue", signals.queue, queue), ("latency", signals.latency, latency),
        ("requestRate", signals.request_rate, rate))
    for name, signal, value in named:
        if value is None and signal.available and signal.problem is None:
            out.append(f"{name}: {STALE}the newest sample is more than a step "
                       f"({signal.step:g}s) older than the time it was read for")
    return tuple(out)


FLOOR_PROBLEM = "latency: the lowest bucket of the latency histogram is"
"""How a problem of the histogram's resolution starts (Reading.problems): a setting to
change, not a signal missing."""


def _floor_above_target(spec: AutoscalingSpec, signals: TargetSignals) -> float | None:
    """The histogram's lowest bucket bound when the target lies under it, else None: a
    quantile at or under that bound says only that the latency is at most the bound."""
    floor = signals.latency_floor_s
    if floor is None or seconds(spec.latency.target) >= floor - FLOAT_NOISE:
        return None
    return floor


def _queue_sustain(spec: AutoscalingSpec, signals: TargetSignals, now: float,
                   queue_now: float | None) -> tuple[float, bool]:
    """(seconds above target without a dip, whether that covers the whole sustain window).

    Sustained means no step of the window at or below target and no more than one step
    missing: a gap in the data is not evidence of load.
    """
    target = spec.queue.target_per_replica
    if queue_now is None or queue_now <= target:
        return 0.0, False
    sustain = seconds(spec.queue.sustain)
    if sustain == 0:
        return 0.0, True
    window = signals.queue
    if window.threshold != target or window.span < sustain:
        raise ValueError(f"the queue window was read for {window.span:g}s against "
                         f"{window.threshold}, not for sustain {sustain:g}s against the target "
                         f"{target:g}")
    if window.dip is None and window.complete:
        return sustain, True
    since_dip = math.inf if window.dip is None else window.end - window.dip - window.step
    above_for = min(since_dip, (window.samples - 1) * window.step)
    return min(max(above_for, 0.0), sustain), False


def _consecutive_breaches(spec: AutoscalingSpec, signals: TargetSignals,
                          floor: float | None = None, settled_at: float | None = None) -> int:
    """Newest-first run of samples above target, each at an evaluation interval, each with at
    least minRequestRate behind it (a quantile over a handful of requests is noise; with
    minRequestRate 0 the rate is not read, so a request rate query that fails alone does
    not void every sample). Samples
    are `step` apart; a missing one (dropped as NaN) breaks the run, since it is not known to
    be above target, and so does one at or under `floor` (`_floor_above_target`), and one
    whose window (`latency_window_s`) reaches back before `settled_at`: its quantile still
    holds the requests served before the replicas changed. Counted, the slow requests of
    before a scale-out read as a breach on the new replicas once they were Ready, and sized
    another scale-out on them (1 to 5 to 20 replicas for a load 3 carry)."""
    target, min_rate = seconds(spec.latency.target), spec.latency.min_request_rate
    longest_gap = signals.latency.step * 1.5  # a sample missing (NaN, a failed rule) ends a run
    points = signals.latency.points
    count, newer = 0, points[-1][0] if points else 0.0
    first = -math.inf if settled_at is None else settled_at + signals.latency_window_s
    for t, latency in reversed(points):
        if (latency <= target or newer - t > longest_gap or t < first
                or (floor is not None and latency <= floor + FLOAT_NOISE)):
            break
        if min_rate > 0:  # with minRequestRate 0, a sample counts whatever the rate
            rate = signals.request_rate.value_at(t)
            if rate is None or rate < min_rate:
                break
        count, newer = count + 1, t
        if count == spec.latency.consecutive_samples:
            # The query is shared by tunings that ask for more samples (its lookback is the
            # longest), and a count past this tuning's own said "5/2 samples above target".
            break
    return count


def queue_is_low(spec: AutoscalingSpec, reading: Reading) -> bool:
    """The queue is at or below its target per replica, and has been at every step of the
    sustain window (a step missing is not known low): a latency breach then comes from
    batching, not from load (action Auto tunes batching, and the batching recommender lowers
    the batch). Low by its newest sample alone, a queue at twice its target for 29s that
    dipped under it at the 30th had the batch halved (every pod re-created), and the next
    interval scaled out on the latency of the load. No queue data is not low: Auto then
    scales out, the SLO is the safe side (unless the breach is found not the load's:
    engine._latency_proposal)."""
    queue = reading.queue_per_replica
    return (queue is not None and queue <= spec.queue.target_per_replica
            and reading.queue_above_ago_s is None and reading.queue_steps is None)
