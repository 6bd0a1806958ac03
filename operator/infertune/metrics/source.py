"""The metrics-source protocol: fetch the autoscaler's signals for many tunings at once.

A source answers for a whole batch so that its cost grows with the number of distinct query
shapes, not with the number of tunings. Prometheus is the source the operator ships with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from infertune.api.scaling import AutoscalingSpec, BatchingMode
from infertune.api.spec import InferenceTuning
from infertune.metrics.presets import (
    EngineMetrics,
    HistogramLatency,
    Template,
    TemplateLatency,
    engine_metrics,
)
from infertune.scaling.signals import TargetSignals


@dataclass(frozen=True)
class MetricsTarget:
    """What to read for one InferenceTuning, and how much history its rules need."""

    key: str
    """Identifies the tuning in the answer, for example "namespace/name"."""
    namespace: str
    deployment: str
    metrics: EngineMetrics
    namespace_label: str = "namespace"
    pod_label: str = "pod"
    window: str = "1m"
    quantile: float = 0.99
    queue_history_s: float = 30.0
    """How far back the queue must be read: its sustain window."""
    queue_target: float = 32.0
    """Waiting requests per replica the sustain window is measured against."""
    latency_step_s: float = 15.0
    """One latency sample per evaluation interval."""
    latency_samples: int = 2
    """Consecutive samples the latency rule needs."""
    want_running: bool = False

    @cached_property
    def uses_templates(self) -> bool:
        """Whether a query read for this target is a PromQL template's (running requests only
        count when they are read: batching on)."""
        metrics = self.metrics
        return (isinstance(metrics.queue_depth, Template)
                or isinstance(metrics.latency, TemplateLatency)
                or (self.want_running and isinstance(metrics.running, Template)))

    @cached_property
    def series_key(self) -> tuple[str, str]:
        """(namespace, Deployment): how the series of a batch's answer name the target."""
        return (self.namespace, self.deployment)

    @cached_property
    def latency_kind(self) -> str:
        if isinstance(self.metrics.latency, HistogramLatency | TemplateLatency):
            return f"p{self.quantile * 100:g}"
        return "mean"


def target_for_tuning(tuning: InferenceTuning) -> MetricsTarget:
    """The target of an InferenceTuning; without spec.autoscaling the defaults apply."""
    spec = tuning.spec
    scaling = spec.autoscaling or AutoscalingSpec()
    namespace = tuning.metadata.namespace or "default"
    return MetricsTarget(
        key=f"{namespace}/{tuning.metadata.name}",
        namespace=namespace,
        deployment=spec.target_ref.name,
        metrics=engine_metrics(spec),
        namespace_label=spec.metrics.namespace_label,
        pod_label=spec.metrics.pod_label,
        window=spec.metrics.window,
        quantile=scaling.latency.quantile,
        queue_history_s=scaling.queue.sustain.seconds,
        queue_target=scaling.queue.target_per_replica,
        latency_step_s=scaling.interval.seconds,
        latency_samples=scaling.latency.consecutive_samples,
        want_running=spec.batching.mode is not BatchingMode.OFF,
    )


class MetricsSource(Protocol):
    def fetch(self, targets: Sequence[MetricsTarget], now: float) -> Mapping[str, TargetSignals]:
        """Signals for every target, keyed by `MetricsTarget.key`, ending at `now` (unix time).

        Never raises for missing data or an unreachable backend: each affected series is
        empty and says why, with the query to run by hand.
        """
        ...
