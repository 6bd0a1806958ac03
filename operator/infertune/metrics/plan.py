"""Which queries one evaluation cycle runs: one per signal per query shape.

Targets that read the same metric names with the same labels, windows, quantile, step and (for
the queue) threshold share one query, which selects all their namespaces; the adapter picks
each target's series out of the answer. The number of queries therefore stays flat as tunings
are added. Latency and request rate are range queries with one point per evaluation interval;
the queue and running gauges are instant window queries (`promql.window_query`).

A PromQL template (spec.metrics.queries) is queried once per namespace instead: unlike a
preset's, its expression can fail on the data (a `group_left` join is "many-to-many" where one
namespace has duplicate series), and Prometheus then answers nothing at all, which must not
cost the tunings of other namespaces their metrics. Its queries grow with the namespaces that
use it, not with the tunings in them, and each names its namespace however long it gets.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import partial
from urllib.parse import quote_plus

from infertune.api.scaling import MAX_CONSECUTIVE_SAMPLES
from infertune.api.units import LONGEST_DURATION_S
from infertune.metrics import promql
from infertune.metrics.presets import Template, TemplateLatency
from infertune.metrics.promql import Scope
from infertune.metrics.source import MetricsTarget

MAX_QUERY_URL = 6000
"""Characters of the URL-encoded query text a batch query is kept under (the URL adds the
host, the path and the time parameters)."""


def url_length(query: str) -> int:
    """The length of `query` as it goes into the URL's query string."""
    return len(quote_plus(query, safe=""))


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
    """Range plans: how far before the end the points start. Window plans: the window."""
    build: Callable[[Scope], str | None]
    """The query for a scope; the plan's query is `build(scope of all members)`."""
    window: bool = False
    """An instant window query, read into a `Window`, rather than a range query."""
    threshold: float | None = None
    """The queue target the window's `dip` is measured against."""
    templated: bool = False
    """The query is a PromQL template's (spec.metrics.queries), not a preset's."""
    floor: Callable[[Scope], str | None] | None = None
    """Latency plans: the query of the histogram's bucket bounds (promql.latency_floor_query)."""

    def scope(self, members: Sequence[MetricsTarget] | None = None) -> Scope:
        """The namespaces and Deployments of all members (each list dropped when it is too long
        to spell out), or exactly `members`."""
        first = (members or self.members)[0]
        chosen = self.members if members is None else members
        namespaces = tuple(sorted({m.namespace for m in chosen}))
        deployments = tuple(sorted({m.deployment for m in chosen}))
        if members is None:
            # A short list is named (Prometheus reads only those pods); a long one is not,
            # so the query text stays flat however many tunings there are.
            if len(promql.one_of(list(deployments))) > promql.MAX_MATCHER:
                deployments = ()
            if len(promql.one_of(list(namespaces))) > promql.MAX_MATCHER:
                namespaces = ()
        return Scope(first.namespace_label, first.pod_label, namespaces, deployments)

    def query(self) -> str | None:
        """The query for every member. A matcher is repeated in each selector of a query, so
        when the URL would grow past MAX_QUERY_URL the Deployments, then the namespaces, are
        no longer named (the adapter keeps its own targets from the wider answer): a proxy in
        front of Prometheus refuses longer URLs (ingress-nginx allows 8 KiB), and every
        tuning of the batch would read as no data. A template's plan keeps its namespace
        (see the module's docstring): still too long, it is sent as it is, and a proxy that
        refuses it fails that namespace's tunings of the template only."""
        return self._widened(self.build)

    def floor_query(self) -> str | None:
        """The query of the latency histogram's bucket bounds over every member's pods."""
        return None if self.floor is None else self._widened(self.floor)

    def _widened(self, build: Callable[[Scope], str | None]) -> str | None:
        scope = self.scope()
        text = build(scope)
        widths = [replace(scope, deployments=())]
        if not self.templated:
            widths.append(replace(scope, deployments=(), namespaces=()))
        for wider in widths:
            if text is None or url_length(text) <= MAX_QUERY_URL:
                break
            if wider != scope:
                scope, text = wider, build(wider)
        return text

    def query_for(self, target: MetricsTarget) -> str:
        """The same query for one target alone, for a person to paste into Prometheus."""
        return self.build(self.scope([target])) or ""

    def floor_query_for(self, target: MetricsTarget) -> str:
        """The bucket bounds' query (`floor_query`) for one target alone, as `query_for`."""
        return "" if self.floor is None else self.floor(self.scope([target])) or ""


def unsupported(target: MetricsTarget) -> str | None:
    if len(target.deployment) > promql.MAX_DEPLOYMENT_NAME:
        return (f"Deployment name {target.deployment!r} is longer than "
                f"{promql.MAX_DEPLOYMENT_NAME} characters; Kubernetes truncates its pod names, "
                "so they cannot be matched to it")
    if not (0 <= target.queue_history_s <= LONGEST_DURATION_S
            and 0 < target.latency_step_s <= LONGEST_DURATION_S
            and target.latency_samples <= MAX_CONSECUTIVE_SAMPLES):
        # The spec validation refuses these; a stored object from before it must not break
        # the batch the other tunings share.
        return (f"the queue sustain ({target.queue_history_s:g}s), the interval "
                f"({target.latency_step_s:g}s) or the samples ({target.latency_samples}) are "
                "beyond what a query can read; fix spec.autoscaling")
    if not promql.whole_millis(target.latency_step_s):
        return (f"the interval ({target.latency_step_s!r}s) is not a whole number of "
                "milliseconds, the finest step Prometheus takes; fix spec.autoscaling.interval")
    return None


def plan_queries(targets: Sequence[MetricsTarget], resolution_s: float) -> list[QueryPlan]:
    """The queries for `targets`, leaving out those `unsupported` refuses."""
    queue: dict[tuple[object, ...], list[MetricsTarget]] = defaultdict(list)
    running: dict[tuple[object, ...], list[MetricsTarget]] = defaultdict(list)
    latency: dict[tuple[object, ...], list[MetricsTarget]] = defaultdict(list)
    rate: dict[tuple[object, ...], list[MetricsTarget]] = defaultdict(list)
    for t in targets:
        if unsupported(t) is not None:
            continue
        metrics = t.metrics
        labels = (metrics, t.namespace_label, t.pod_label)
        span = _aligned(t.queue_history_s, resolution_s)
        # A template's $window makes the gauges' query depend on the window too.
        gauges = (*labels, t.window if metrics.gauges_use_window else None)
        queue[(*gauges, span, t.queue_target if span > 0 else None,
               _alone(metrics.queue_depth, t))].append(t)
        if t.want_running and metrics.running is not None:
            running[(*gauges, max(span, resolution_s), _alone(metrics.running, t))].append(t)
        # Latency and request rate read only the latency metrics, and the rate no quantile:
        # tunings that differ in anything else share these queries.
        read = (metrics.latency, t.namespace_label, t.pod_label, t.window, t.latency_step_s,
                _alone(metrics.latency, t))
        latency[(*read, t.quantile)].append(t)
        rate[read].append(t)
    plans = []
    for members in queue.values():
        metrics, span = members[0].metrics, _aligned(members[0].queue_history_s, resolution_s)
        threshold = members[0].queue_target if span > 0 else None
        queue_build: Callable[[Scope], str | None] = partial(
            promql.queue_query, metrics=metrics, span_s=max(span, resolution_s),
            step_s=resolution_s, threshold=threshold, window=members[0].window)
        plans.append(QueryPlan(Signal.QUEUE, tuple(members), resolution_s, span, queue_build,
                               window=True, threshold=threshold,
                               templated=isinstance(metrics.queue_depth, Template)))
    for members in running.values():
        metrics = members[0].metrics
        span = max(_aligned(members[0].queue_history_s, resolution_s), resolution_s)
        running_build: Callable[[Scope], str | None] = partial(
            promql.running_query, metrics=metrics, span_s=span, step_s=resolution_s,
            window=members[0].window)
        plans.append(QueryPlan(Signal.RUNNING, tuple(members), resolution_s, span,
                               running_build, window=True,
                               templated=isinstance(metrics.running, Template)))
    for members in latency.values():
        first = members[0]
        plans.append(QueryPlan(
            Signal.LATENCY, tuple(members), first.latency_step_s, _lookback(members),
            partial(promql.latency_query, metrics=first.metrics, quantile=first.quantile,
                    window=first.window),
            templated=isinstance(first.metrics.latency, TemplateLatency),
            floor=partial(promql.latency_floor_query, metrics=first.metrics,
                          window=first.window)))
    for members in rate.values():
        first = members[0]
        plans.append(QueryPlan(
            Signal.REQUEST_RATE, tuple(members), first.latency_step_s, _lookback(members),
            partial(promql.request_rate_query, metrics=first.metrics, window=first.window),
            templated=isinstance(first.metrics.latency, TemplateLatency)))
    return plans


def _alone(read: object, target: MetricsTarget) -> str | None:
    """The namespace a query of `read` is kept to, when it is a PromQL template's (see the
    module's docstring; `QueryPlan.query` never widens it past it); None for a preset's,
    which every namespace shares."""
    return target.namespace if isinstance(read, Template | TemplateLatency) else None


def _lookback(members: Sequence[MetricsTarget]) -> float:
    """How far back a range plan reads: its members' longest run of latency samples."""
    return members[0].latency_step_s * (max(m.latency_samples for m in members) - 1)


def _aligned(seconds: float, step: float) -> float:
    return math.ceil(seconds / step) * step
