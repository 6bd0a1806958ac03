"""The operator's own metrics (`infertune run --metrics-port`), for dashboards and alerts.

What the autoscaler decided last for each tuning is kept as it is decided (`Reported`, one
tuple per evaluation) and turned into samples only when Prometheus scrapes, as
kube-state-metrics does: a cycle over 1000 tunings pays nothing for a gauge. Only the process
that leads exports the autoscaler's series (the others evaluate nothing, and a process that
lost the Lease would export what it decided before).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "infertune_autoscaling_"
TUNING_LABELS = ("namespace", "name", "deployment")


class Reported(NamedTuple):
    """One tuning's last evaluation, as the metrics give it."""

    deployment: str
    current: int
    desired: int
    action: str
    latency_s: float | None
    latency_kind: str
    queue: float | None
    evaluated: float
    """Unix time of the evaluation."""
    conditions: tuple[tuple[str, str, str], ...]
    """(type, status, reason) of the autoscaler's conditions as it set them."""
    dry_run: bool
    interval_s: float
    """spec.autoscaling.interval: how often it is evaluated."""


class Counts(NamedTuple):
    """Running totals since the process started (Prometheus takes their resets)."""

    scale_writes: Mapping[tuple[str, str], int]
    """(tuning key, "out" or "in") -> replicas writes that landed."""
    failures: Mapping[str, int]
    """tuning key -> evaluations that raised."""
    fetches: int
    """Batched Prometheus fetches (one per interval slot, for all tunings)."""


class AutoscalerCollector(Collector):
    """Samples from what `reported()` and `counts()` hold at scrape time, while `leads()`."""

    def __init__(self, reported: Callable[[], Mapping[str, Reported]],
                 counts: Callable[[], Counts], leads: Callable[[], bool]) -> None:
        self._reported, self._counts, self._leads = reported, counts, leads

    def describe(self) -> Iterator[Metric]:
        # The families without samples, so that registering does not call collect().
        yield from _families({}, Counts({}, {}, 0))

    def collect(self) -> Iterator[Metric]:
        if not self._leads():
            return
        # Copies: the loops change the tables in other threads while this runs.
        yield from _families(dict(self._reported()), self._counts())


def _families(reported: Mapping[str, Reported], counts: Counts) -> Iterator[Metric]:
    def gauge(name: str, documentation: str,
              extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, documentation,
                                 labels=(*TUNING_LABELS, *extra))

    current = gauge("current_replicas", "Replicas of the target at the last evaluation.")
    desired = gauge("desired_replicas", "Replicas the last evaluation asked for (written "
                    "unless mode is DryRun or something blocks the write: see the "
                    "ScalingActive condition).")
    latency = gauge("latency_seconds", "The latency signal at the last evaluation (the "
                    "quantile of spec.autoscaling.latency, or a mean: `kind`); absent "
                    "without data.", ("kind",))
    queue = gauge("queue_per_replica", "Requests waiting per replica at the last "
                  "evaluation; absent without data.")
    evaluated = gauge("last_evaluation_timestamp_seconds", "When the tuning was last "
                      "evaluated (Unix time): alert when it falls behind the interval.")
    interval = gauge("interval_seconds", "spec.autoscaling.interval: how often the tuning "
                     "is evaluated.")
    action = gauge("action", "1 for the action of the last evaluation (ScaleOut, ScaleIn, "
                   "Hold, TuneBatching, Fallback, Disabled).", ("action", "mode"))
    condition = gauge("condition", "1 for each of the autoscaler's conditions "
                      "(ScalingActive, ScalingLimited, MetricsAvailable) with its status "
                      "and reason.", ("type", "status", "reason"))
    for key, r in sorted(reported.items()):
        namespace, _, name = key.partition("/")
        labels = [namespace, name, r.deployment]
        current.add_metric(labels, r.current)
        desired.add_metric(labels, r.desired)
        if r.latency_s is not None:
            latency.add_metric([*labels, r.latency_kind], r.latency_s)
        if r.queue is not None:
            queue.add_metric(labels, r.queue)
        evaluated.add_metric(labels, r.evaluated)
        interval.add_metric(labels, r.interval_s)
        action.add_metric([*labels, r.action, "DryRun" if r.dry_run else "Enforce"], 1)
        for kind, status, reason in r.conditions:
            condition.add_metric([*labels, kind, status, reason], 1)
    writes = CounterMetricFamily(PREFIX + "scale_writes", "Replicas writes through the "
                                 "scale subresource that landed, by direction.",
                                 labels=("namespace", "name", "direction"))
    for (key, direction), count in sorted(counts.scale_writes.items()):
        namespace, _, name = key.partition("/")
        writes.add_metric([namespace, name, direction], count)
    failures = CounterMetricFamily(PREFIX + "evaluation_failures", "Evaluations that "
                                   "raised (the operator log has the traceback).",
                                   labels=("namespace", "name"))
    for key, count in sorted(counts.failures.items()):
        namespace, _, name = key.partition("/")
        failures.add_metric([namespace, name], count)
    fetches = CounterMetricFamily(PREFIX + "prometheus_fetches", "Batched reads of "
                                  "Prometheus, one per interval slot for every tuning.")
    fetches.add_metric([], counts.fetches)
    yield from (current, desired, latency, queue, evaluated, interval, action, condition,
                writes, failures, fetches)


def reported_of(deployment: str, current: int, desired: int, action: str,
                latency_s: float | None, latency_kind: str, queue: float | None,
                evaluated: float, conditions: tuple[Mapping[str, object], ...],
                dry_run: bool, interval_s: float) -> Reported:
    """A `Reported` from an evaluation's values and its condition dicts."""
    return Reported(deployment, current, desired, action, latency_s, latency_kind, queue,
                    evaluated, reported_conditions(conditions), dry_run, interval_s)


def reported_conditions(conditions: tuple[Mapping[str, object], ...]
                        ) -> tuple[tuple[str, str, str], ...]:
    """(type, status, reason) of condition dicts as stored in status."""
    return tuple((str(c["type"]), str(c["status"]), str(c["reason"])) for c in conditions)
