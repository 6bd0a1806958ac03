"""PromQL for many targets at once, with every value from users escaped.

Label values (namespaces, Deployment names) go into double-quoted PromQL strings, so
backslash, double quote and line breaks are escaped; inside regex matchers they are first
regex-escaped with Go's regexp.QuoteMeta set. Metric and label names come validated from the
spec and are checked again here, because a name is spliced into the query unquoted.

Series are mapped to targets in Prometheus itself: `label_replace` derives the Deployment from
the pod name, so each signal returns one series per target, whatever the number of pods.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infertune.api.spec import METRIC_NAME, PROM_LABEL_NAME
from infertune.metrics.presets import EngineMetrics, HistogramLatency

TARGET_LABEL = "infertune_target"
# Pods of a Deployment are named <deployment>-<pod-template-hash>-<5 random> (the hash is at
# most 10 characters, names.SimpleNameGenerator adds 5); neither part contains a dash.
POD_SUFFIX = "-[a-z0-9]{1,10}-[a-z0-9]{5}"
# Kubernetes truncates generated names to 58 characters before the random suffix, so longer
# Deployment names leave pod names the suffix pattern cannot split.
MAX_DEPLOYMENT_NAME = 58 - len("-0123456789-")

_METRIC = re.compile(METRIC_NAME)
_LABEL = re.compile(PROM_LABEL_NAME)
_REGEX_META = frozenset("\\.+*?()|[]{}^$")
_STRING_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"}


def quote(value: str) -> str:
    """A PromQL double-quoted string literal holding exactly `value`."""
    return '"' + "".join(_STRING_ESCAPES.get(c, c) for c in value) + '"'


def regex_escape(value: str) -> str:
    """`value` as a regular expression matching only itself (Go's regexp.QuoteMeta)."""
    return "".join("\\" + c if c in _REGEX_META else c for c in value)


def metric_name(name: str) -> str:
    if not _METRIC.fullmatch(name):
        raise ValueError(f"{name!r} is not a Prometheus metric name")
    return name


def label_name(name: str) -> str:
    if not _LABEL.fullmatch(name) or name.startswith("__"):
        raise ValueError(f"{name!r} is not a Prometheus label name")
    return name


def window_text(window: str) -> str:
    if not re.fullmatch(r"[0-9]+(ms|s|m|h)", window):
        raise ValueError(f"{window!r} is not a PromQL duration such as 1m")
    return window


def one_of(values: list[str]) -> str:
    """A regex matching exactly one of `values` (Prometheus anchors label regexes)."""
    return "|".join(regex_escape(v) for v in sorted(set(values)))


def spellings(name: str) -> tuple[str, ...]:
    """The metric as written and, for a name with a colon, with underscores (the colon trap)."""
    metric_name(name)
    underscored = name.replace(":", "_")
    return (name,) if underscored == name else (name, underscored)


@dataclass(frozen=True)
class Scope:
    """Which series a query reads: the label names, the namespaces and Deployments."""

    namespace_label: str
    pod_label: str
    namespaces: tuple[str, ...]
    deployments: tuple[str, ...]

    def matchers(self) -> str:
        ns, pod = label_name(self.namespace_label), label_name(self.pod_label)
        pods = f"(?:{one_of(list(self.deployments))}){POD_SUFFIX}"
        return f"{ns}=~{quote(one_of(list(self.namespaces)))},{pod}=~{quote(pods)}"

    def by(self, *extra: str) -> str:
        return ", ".join((self.namespace_label, TARGET_LABEL, *extra))


def _per_target(scope: Scope, expr: str) -> str:
    """`expr` with a target label holding the Deployment its pod belongs to."""
    pattern = quote(f"(.+){POD_SUFFIX}")
    return f'label_replace({expr}, "{TARGET_LABEL}", "$1", "{scope.pod_label}", {pattern})'


def _gauge(scope: Scope, name: str) -> str:
    # `or` matches label sets without the metric name, so a pod exported under both spellings
    # counts once (the colon spelling wins).
    return " or ".join(f"{n}{{{scope.matchers()}}}" for n in spellings(name))


def _rate(scope: Scope, name: str, window: str) -> str:
    # rate() drops the name; joining with `or` keeps two spellings from colliding.
    return " or ".join(f"rate({n}{{{scope.matchers()}}}[{window_text(window)}])"
                       for n in spellings(name))


def queue_query(scope: Scope, metrics: EngineMetrics) -> str:
    return f"avg by ({scope.by()}) ({_per_target(scope, _gauge(scope, metrics.queue_depth))})"


def running_query(scope: Scope, metrics: EngineMetrics) -> str | None:
    if metrics.running is None:
        return None
    return f"avg by ({scope.by()}) ({_per_target(scope, _gauge(scope, metrics.running))})"


def latency_query(scope: Scope, metrics: EngineMetrics, quantile: float, window: str) -> str:
    latency = metrics.latency
    if isinstance(latency, HistogramLatency):
        buckets = _rate(scope, f"{latency.name}_bucket", window)
        summed = f"sum by ({scope.by('le')}) ({_per_target(scope, buckets)})"
        return f"histogram_quantile({quantile!r}, {summed})"
    total = _rate(scope, latency.total, window)
    count = _rate(scope, latency.requests, window)
    return (f"sum by ({scope.by()}) ({_per_target(scope, total)}) / "
            f"sum by ({scope.by()}) ({_per_target(scope, count)}) * {latency.to_seconds!r}")


def request_rate_query(scope: Scope, metrics: EngineMetrics, window: str) -> str:
    latency = metrics.latency
    counter = (f"{latency.name}_count" if isinstance(latency, HistogramLatency)
               else latency.requests)
    return f"sum by ({scope.by()}) ({_per_target(scope, _rate(scope, counter, window))})"
