"""Which range queries one evaluation cycle runs: one per signal per query shape.

Targets that read the same metric names with the same labels, window, quantile and step share
one query, whose scope lists all their namespaces and Deployments; its lookback is the longest
any member needs. The number of queries therefore stays flat as tunings are added.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import partial

from infertune.metrics import promql
from infertune.metrics.promql import Scope
from infertune.metrics.source import MetricsTarget


class Signal(StrEnum):
    QUEUE = "queue"
    RUNNING = "running"
    LATENCY = "latency"
    REQUEST_RATE = "requestRate"


@dataclass(frozen=True)
class QueryPlan:
    signal: Signal
    members: tuple[MetricsTarget, ...]
    step_s: float
    lookback_s: float
    build: Callable[[Scope], str | None]
    """The query for a scope; the plan's query is `build(scope of all members)`."""

    def scope(self, members: Sequence[MetricsTarget] | None = None) -> Scope:
        members = self.members if members is None else members
        first = members[0]
        return Scope(first.namespace_label, first.pod_label,
                     tuple(sorted({m.namespace for m in members})),
                     tuple(sorted({m.deployment for m in members})))

    def query(self) -> str | None:
        return self.build(self.scope())

    def query_for(self, target: MetricsTarget) -> str:
        """The same query for one target alone, for a person to paste into Prometheus."""
        return self.build(self.scope([target])) or ""


def unsupported(target: MetricsTarget) -> str | None:
    if len(target.deployment) > promql.MAX_DEPLOYMENT_NAME:
        return (f"Deployment name {target.deployment!r} is longer than "
                f"{promql.MAX_DEPLOYMENT_NAME} characters; Kubernetes truncates its pod names, "
                "so they cannot be matched to it")
    return None


def plan_queries(targets: Sequence[MetricsTarget], resolution_s: float) -> list[QueryPlan]:
    """The queries for `targets`, leaving out those `unsupported` refuses."""
    fine: dict[tuple[object, ...], list[MetricsTarget]] = defaultdict(list)
    coarse: dict[tuple[object, ...], list[MetricsTarget]] = defaultdict(list)
    for t in targets:
        if unsupported(t) is None:
            labels = (t.metrics, t.namespace_label, t.pod_label)
            fine[labels].append(t)
            coarse[(*labels, t.window, t.quantile, t.latency_step_s)].append(t)
    plans = []
    for members in fine.values():
        lookback = _aligned(max(m.queue_history_s for m in members), resolution_s)
        metrics = members[0].metrics
        plans.append(QueryPlan(Signal.QUEUE, tuple(members), resolution_s, lookback,
                               partial(promql.queue_query, metrics=metrics)))
        running = tuple(m for m in members if m.want_running)
        if running and metrics.running is not None:
            plans.append(QueryPlan(Signal.RUNNING, running, resolution_s, lookback,
                                   partial(promql.running_query, metrics=metrics)))
    for members in coarse.values():
        first = members[0]
        step = first.latency_step_s
        lookback = step * (max(m.latency_samples for m in members) - 1)
        plans.append(QueryPlan(
            Signal.LATENCY, tuple(members), step, lookback,
            partial(promql.latency_query, metrics=first.metrics, quantile=first.quantile,
                    window=first.window)))
        plans.append(QueryPlan(
            Signal.REQUEST_RATE, tuple(members), step, lookback,
            partial(promql.request_rate_query, metrics=first.metrics, window=first.window)))
    return plans


def _aligned(seconds: float, step: float) -> float:
    return math.ceil(seconds / step) * step
