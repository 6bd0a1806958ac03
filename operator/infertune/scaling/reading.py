"""Read the signal histories against the spec: current values, sustain and consecutive breaches.

Both rules are evaluated from the history Prometheus returns, never from memory, so a restarted
operator sees exactly what one that kept running would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infertune.api.scaling import AutoscalingSpec
from infertune.scaling.signals import TargetSignals, seconds


@dataclass(frozen=True)
class Reading:
    """What the signals say at `now`, in the units of the spec."""

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
            "problems": list(self.problems),
        }


def read_signals(spec: AutoscalingSpec, signals: TargetSignals, now: float) -> Reading:
    queue_now = signals.queue.latest(now)
    above_for, sustained = _queue_sustain(spec, signals, now, queue_now)
    latency_now = signals.latency.latest(now)
    rate_now = signals.request_rate.latest(now)
    breaches = _consecutive_breaches(spec, signals)
    quiet = rate_now is not None and rate_now < spec.latency.min_request_rate
    running = signals.running.since(now - seconds(spec.queue.sustain) - signals.running.step)
    return Reading(
        queue_per_replica=queue_now,
        queue_above_for_s=above_for,
        queue_sustained=sustained,
        latency_s=None if quiet else latency_now,
        latency_kind=signals.latency_kind,
        request_rate=rate_now,
        breaches=breaches,
        latency_breached=breaches >= spec.latency.consecutive_samples,
        latency_quiet=quiet,
        running_per_replica=signals.running.latest(now),
        running_peak=max((v for _, v in running), default=None),
        problems=signals.problems(),
    )


def _queue_sustain(spec: AutoscalingSpec, signals: TargetSignals, now: float,
                   queue_now: float | None) -> tuple[float, bool]:
    """(seconds above target without a break, whether that covers the whole sustain window)."""
    target = spec.queue.target_per_replica
    if queue_now is None or queue_now <= target:
        return 0.0, False
    series = signals.queue
    since = now
    for t, value in reversed(series.points):
        if value <= target or since - t > 1.5 * series.step + 0.5:
            break  # a dip or a gap in the data ends the run
        since = t
    above_for = now - since
    sustain = seconds(spec.queue.sustain)
    return min(above_for, sustain), above_for >= sustain - series.step / 2 and (
        sustain == 0 or series.covers(now - sustain, now))


def _consecutive_breaches(spec: AutoscalingSpec, signals: TargetSignals) -> int:
    """Newest-first run of samples above target, each at an evaluation interval, each with at
    least minRequestRate behind it (a quantile over a handful of requests is noise)."""
    target = seconds(spec.latency.target)
    count = 0
    for t, latency in reversed(signals.latency.points):
        rate = signals.request_rate.value_at(t)
        if rate is None or rate < spec.latency.min_request_rate or latency <= target:
            break
        count += 1
    return count
