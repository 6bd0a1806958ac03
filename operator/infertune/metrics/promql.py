"""PromQL for many targets at once, with every value from users escaped.

Label values (namespaces, Deployment names) go into double-quoted PromQL strings, so
backslash, double quote and line breaks are escaped; inside regex matchers they are first
regex-escaped with Go's regexp.QuoteMeta set. Metric and label names come validated from the
spec and are checked again here, because a name is spliced into the query unquoted.

A PromQL template (spec.metrics.queries) stands where a metric selector would: the user's
expression, per pod, with the same escaped matchers for its `$selector` (api/templates.py).

Series are mapped to targets in Prometheus itself: `label_replace` derives the Deployment from
the pod name, so each signal returns one series per Deployment, whatever the number of pods.
A batch query names its targets' namespaces and Deployments while the lists are short; for a
long list it selects any pod named like a Deployment's pod, and the adapter keeps the
Deployments it asked about. A query for one target (shown to people in conditions) names its
Deployment, so it can be pasted as it is.

The queue and running gauges are read as a window (`window_query`): one instant query whose
series carry a `infertune_stat` label, `last` (the value now), `dip` (the newest step at or
below a threshold), `samples` (steps with finite data), `peak` (the highest step) and, for the
queue, `pods` (how many pods report it now).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from infertune.api.spec import (
    METRIC_NAME,
    PROM_LABEL_NAME,
    PROMQL_RESERVED,
    promql_spelling,
    query_label_problems,
)
from infertune.api.spec import STAT_LABEL as STAT_LABEL
from infertune.api.spec import TARGET_LABEL as TARGET_LABEL
from infertune.api.templates import fill
from infertune.metrics.presets import (
    EngineMetrics,
    HistogramLatency,
    Latency,
    Template,
    TemplateLatency,
)
from infertune.scaling.signals import full_window_steps

# Pods of a Deployment are named <deployment>-<pod-template-hash>-<5 random> (the hash is at
# most 10 characters, names.SimpleNameGenerator adds 5). Both parts are drawn from the
# alphabet of k8s.io/apimachinery/pkg/util/rand, which has no vowels and no 0, 1 or 3: so the
# pods of a DaemonSet or Job named <deployment>-node or <deployment>-warmup (one word and a
# suffix) are not taken for the Deployment's. A limit: a CronJob named like the Deployment
# names its Jobs <cronjob>-<minutes since 1970>, so its pods (qwen-29244456-bcdfg) match when
# those digits avoid 0, 1 and 3, and are counted if they export the same metric.
# The hash is the decimal digits of a uint32, each encoded as one character: at least 4 of
# them but for one ReplicaSet in 4 million (a hash under 1000), so a word of up to three
# consonants (a Job qwen-sft, a DaemonSet llm-dp) is no hash either.
GENERATED = "[b-df-hj-np-tv-xz24-9]"
"""bcdfghjklmnpqrstvwxz2456789 as ranges: the class is in every pod matcher of a query, twice,
and in every label_replace that cuts a pod's name, so its length counts against MAX_QUERY_URL
(plan.py) some 30 times."""
POD_SUFFIX = f"-{GENERATED}{{4,10}}-{GENERATED}{{5}}"
# Kubernetes truncates generated names to 58 characters before the random suffix, so longer
# Deployment names leave pod names the suffix pattern cannot split.
MAX_DEPLOYMENT_NAME = 58 - len("-0123456789-")
MAX_MATCHER = 1024
"""Above this many characters of Deployment (or namespace) alternation a batch query selects
the pods of any Deployment (or every namespace), and the adapter keeps its own targets: the
matcher is repeated in every selector of a query, and proxies in front of Prometheus refuse
long URLs."""

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
    if not _METRIC.fullmatch(name) or name.lower() in PROMQL_RESERVED:
        raise ValueError(f"{name!r} is not a Prometheus metric name a query can use")
    return name


def label_name(name: str) -> str:
    if not _LABEL.fullmatch(name) or name.lower() in PROMQL_RESERVED:
        raise ValueError(f"{name!r} is not a Prometheus label name a query can use")
    return name


def window_text(window: str) -> str:
    if not re.fullmatch(r"[0-9]+(ms|s|m|h)", window):
        raise ValueError(f"{window!r} is not a PromQL duration such as 1m")
    return window


def one_of(values: list[str]) -> str:
    """A regex matching exactly one of `values` (Prometheus anchors label regexes)."""
    return "|".join(regex_escape(v) for v in sorted(set(values)))


def number(value: float) -> str:
    """A finite float as a PromQL number literal."""
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return repr(float(value))


def whole_millis(seconds: float) -> bool:
    """Whether `seconds` is a positive whole number of milliseconds, as Prometheus keeps time."""
    millis = round(seconds * 1000)
    return millis > 0 and abs(millis - seconds * 1000) <= 1e-6


def duration(seconds: float) -> str:
    """Whole seconds or milliseconds as a PromQL duration, for subquery ranges and the step
    of a range query."""
    if not whole_millis(seconds):
        raise ValueError(f"{seconds!r}s is not a positive whole number of milliseconds")
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def spellings(name: str) -> tuple[str, ...]:
    """The metric as written and, for a name with a colon, with underscores (the colon trap).
    A name whose underscored spelling is a keyword (`group:left`) is refused like a keyword:
    the query would not parse, and its tunings would never get data."""
    metric_name(name)
    underscored = promql_spelling(name)
    if underscored.lower() in PROMQL_RESERVED:
        raise ValueError(f"{name!r} is also read as {underscored!r}, a PromQL keyword no query "
                         "can use as a metric name; rename the metric in spec.metrics")
    return (name,) if underscored == name else (name, underscored)


@dataclass(frozen=True)
class Scope:
    """Which series a query reads: the label names, the namespaces and Deployments.

    No namespaces: every namespace. No Deployments: the pods of any Deployment.
    """

    namespace_label: str
    pod_label: str
    namespaces: tuple[str, ...] = ()
    deployments: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # `validate` refuses these (spec.apply_problems); the models take them, as an older
        # release did, so a stored object fails its own plan rather than put colliding
        # labels into a query ("vector cannot contain metrics with the same labelset") or
        # find nothing.
        label_name(self.pod_label)
        label_name(self.namespace_label)
        problems = query_label_problems(self.pod_label, self.namespace_label)
        if problems:
            field, problem = problems[0]
            raise ValueError(f"spec.metrics.{field}: {problem}")

    def matchers(self) -> str:
        ns, pod = label_name(self.namespace_label), label_name(self.pod_label)
        names = f"(?:{one_of(list(self.deployments))})" if self.deployments else ".+"
        pods = f"{pod}=~{quote(names + POD_SUFFIX)}"
        if not self.namespaces:
            return pods
        return f"{ns}=~{quote(one_of(list(self.namespaces)))},{pods}"

    def by(self, *extra: str) -> str:
        return ", ".join((self.namespace_label, TARGET_LABEL, *extra))


def _per_target(scope: Scope, expr: str) -> str:
    """`expr` with a target label holding the Deployment its pod belongs to."""
    pattern = quote(f"(.+){POD_SUFFIX}")
    return f'label_replace({expr}, "{TARGET_LABEL}", "$1", "{scope.pod_label}", {pattern})'


def filled(scope: Scope, template: Template, window: str) -> str:
    """A template (spec.metrics.queries) with the scope's matchers for `$selector` and the
    window for `$window`, in parentheses: it is the user's whole expression. The closing one
    goes on a line of its own, so that a comment ending the template cannot hide it."""
    return "(" + fill(template.text, {"selector": scope.matchers(),
                                      "window": window_text(window)}) + "\n)"


SCRAPE_JOB_LABEL = "job"
"""The label Prometheus gives every series of a scrape job. A pod scraped twice (a PodMonitor
beside a ServiceMonitor, or one of them beside the prometheus.io/scrape annotation job) has
two copies of each series, one per job, from the same `instance` (the pod's address); the
jobs add labels of their own besides (`endpoint`, `service` and `container` from the
Prometheus Operator, every pod label from the annotation job's labelmap). Summed per pod,
its queue and request rate counted twice, and the Deployment scaled out on half its real
queue."""
SCRAPE_LABELS = (SCRAPE_JOB_LABEL, "endpoint", "service")
"""The labels the scrape job itself adds (Prometheus, and the Prometheus Operator)."""
RANK_COPIES = {"sglang": ("tp_rank", "pp_rank", "moe_ep_rank")}
"""Engine (the prefix of its metric names) -> the labels of series that are copies of one
queue, taken once (the largest) before a pod's series are summed. SGLang labels each
scheduler's gauges with its tensor-, pipeline- and expert-parallel rank (and its
data-parallel rank, `dp_rank`, whose queues are apart and add up); with
--enable-metrics-for-all-schedulers every tensor-parallel rank exports the waiting queue it
was broadcast, and summed they read it tp-size times over (its expert-parallel rank moves
with the tensor-parallel one under --ep-size). A rank that holds none of it (0) does not
lower the largest. Only for the engines' own names (a spec.metrics.queueDepth of another
name is summed as it is), and only where they have them: the queue query is near the URL
limit (plan.MAX_QUERY_URL)."""
KEPT_LABELS = ("instance",)
"""Kept apart while the copies are taken once: two engine processes on two ports of a pod are
two instances, whose queues add up."""


def _once(scope: Scope, expr: str, *kept_too: str) -> str:
    """`expr` with the copies of a series scraped along several paths taken once: summed
    within each path (job, and the endpoint and Service it was found through: a pod's series
    per model or rank), the largest path's sum per instance kept (the copies are the same
    samples; a path that reads only some of them does not lower it). The target's own labels
    are kept, and `kept_too` (a histogram's `le`)."""
    kept = list(dict.fromkeys(label_name(label) for label in (
        scope.namespace_label, scope.pod_label, *KEPT_LABELS, *kept_too)))
    # The pod label may be one of SCRAPE_LABELS itself.
    per_path = dict.fromkeys([*kept, *SCRAPE_LABELS])
    # Without spaces: the window query repeats it six times, and its URL has a limit
    # (plan.MAX_QUERY_URL).
    return f"max by ({','.join(kept)}) (sum by ({','.join(per_path)}) ({expr}))"


def _copies_merged(scope: Scope, expr: str) -> str:
    """`expr` with the copies of a series that differ only in SCRAPE_LABELS taken once, every
    other label kept: for a mean over series, which copies of every series leave as it is
    (the running batch of each data-parallel rank of a pod). A limit: when only some pods
    are scraped by two jobs that add labels of their own besides (`container`, a labelmap's
    pod labels), their copies stay apart and weigh twice in the mean.

    The operator's own labels go too: an exporter's series that carry `infertune_target`
    (two of a pod, differing only in it) became one label set once `_per_target` set it, and
    Prometheus refused the whole query (422 "vector cannot contain metrics with the same
    labelset"), which every tuning of the batch shares, in every namespace."""
    drop = [label for label in (*SCRAPE_LABELS, TARGET_LABEL, STAT_LABEL)
            if label not in (scope.namespace_label, scope.pod_label)]
    return f"max without ({', '.join(drop)}) ({expr})"


def _gauge(scope: Scope, name: str | Template, window: str, summed: bool = True) -> str:
    """The gauge's series for the scope; `summed`: to be summed (per pod), so the copies of
    several scrape jobs are taken once (`_once`), else only those that differ in nothing but
    the job's own labels (`_copies_merged`)."""
    if isinstance(name, Template):
        return filled(scope, name, window)
    # `or` matches label sets without the metric name, so a pod exported under both spellings
    # counts once (the colon spelling wins).
    either = " or ".join(f"{n}{{{scope.matchers()}}}" for n in spellings(name))
    if not summed:
        return _copies_merged(scope, either)
    ranks = RANK_COPIES.get(re.split("[:_]", name, maxsplit=1)[0])
    if ranks is not None:
        # The copies of a queue each rank exports, once (`RANK_COPIES`); the two spellings
        # of a pod's series are taken once by it too (the aggregation drops the name).
        either = f"max without({','.join(ranks)})({either})"
    return _once(scope, either)


def _rate(scope: Scope, name: str | Template, window: str) -> str:
    if isinstance(name, Template):
        return filled(scope, name, window)
    # rate() drops the name; joining with `or` keeps two spellings from colliding.
    return _once(scope, " or ".join(f"rate({n}{{{scope.matchers()}}}[{window_text(window)}])"
                                    for n in spellings(name)), "le")  # buckets keep theirs


def _stat(expr: str, stat: str) -> str:
    return f'label_replace({expr}, "{STAT_LABEL}", "{stat}", "", "")'


def window_query(expr: str, span_s: float, step_s: float, threshold: float | None = None,
                 peak: bool = False, pods: str | None = None) -> str:
    """`expr` (one series per target) summed up over the trailing `span_s`, as `Window` reads
    it. `dip` is only returned while the value is above `threshold`: the sustain rule needs
    it then, and most targets are below target most of the time. `samples` only where the
    window has fewer steps than a full one (Window.expected_samples; absent, it is full), and
    `rise`, the newest step above `threshold`, only where there is one: with the value at or
    below it now, a latency breach is the batch's only with neither (reading.queue_is_low).
    `pods` (one series per target) is returned now, as the `pods` stat."""
    finite = f"({expr}) < Inf > -Inf"  # NaN fails every comparison, so it is not a sample
    # As it is: a NaN now is reported as such, not as absent (the queue's and the running
    # requests' means leave NaN out, and their `pods` stat, 0 then, says it).
    parts = [_stat(expr, "last")]
    if pods is not None:
        parts.append(_stat(pods, "pods"))
    window = f"[{duration(span_s)}:{duration(step_s)}]"
    if threshold is not None:
        limit = number(threshold)
        above = f"({finite}) > {limit}"
        full = full_window_steps(span_s, step_s)
        parts += [
            _stat(f"max_over_time(timestamp(({finite}) <= {limit}){window}) and {above}", "dip"),
            _stat(f"count_over_time(({finite}){window}) < {full}", "samples"),
            _stat(f"max_over_time(timestamp({above}){window})", "rise"),
        ]
    if peak:
        parts.append(_stat(f"max_over_time(({finite}){window})", "peak"))
    return " or ".join(parts)


def _per_pod(scope: Scope, name: str | Template, window: str, summed: bool = True) -> str:
    """Gauge `name` summed per pod: an engine that exports it once per model (Triton) or per
    data-parallel rank has several series per pod. `summed` False: only counted (the copies
    of several scrape paths do not matter then; see `_gauge`)."""
    return (f"sum by ({scope.by(label_name(scope.pod_label))}) "
            f"({_per_target(scope, _gauge(scope, name, window, summed))})")


def _finite_mean(by: str, expr: str) -> str:
    """The mean by `by` of the values of `expr` below +Inf (NaN fails every comparison): the
    mean of them all was NaN as soon as one pod exported NaN (a broken exporter), which held
    the whole Deployment with "only NaN or infinite values" while its other pods reported. A
    -Inf is kept: the mean is then the negative value the adapter refuses, naming it."""
    return f"avg by ({by}) (({expr}) < Inf)"


def _finite_count(by: str, expr: str) -> str:
    """How many values of `expr` by `by` `_finite_mean` is over, as a number that is 0, not
    absent, where there are none: a target whose values are all NaN then has this and no
    mean, which the adapter says is "only NaN or infinite values" rather than no series."""
    return f"sum by ({by}) (({expr}) < bool Inf)"


def gauge_query(scope: Scope, name: str | Template, window: str = "1m") -> str:
    """The mean over each target's pods of gauge `name` (summed per pod), one series per
    target: over the pods with a finite value (`_finite_mean`). `window` fills a template's
    `$window`."""
    return _finite_mean(scope.by(), _per_pod(scope, name, window))


def pods_query(scope: Scope, name: str | Template, window: str = "1m") -> str:
    """How many of each target's pods export gauge `name` with a value below +Inf now (pods,
    not series; `gauge_query`'s mean is over them), one series per target, 0 where every pod
    exports NaN."""
    return _finite_count(scope.by(), _per_pod(scope, name, window, summed=False))


def queue_query(scope: Scope, metrics: EngineMetrics, span_s: float, step_s: float,
                threshold: float | None, window: str = "1m") -> str:
    """The queue per pod over the window, and how many pods report it: the engine sizes the
    queue on those pods (the requests waiting over the target)."""
    gauge = gauge_query(scope, metrics.queue_depth, window)
    return window_query(gauge, span_s, step_s, threshold=threshold,
                        pods=pods_query(scope, metrics.queue_depth, window))


def running_query(scope: Scope, metrics: EngineMetrics, span_s: float,
                  step_s: float, window: str = "1m") -> str | None:
    """Requests being served, as the mean over each target's series rather than summed per
    pod: the batch knobs (max-num-seqs) are per engine process, and a pod that runs several
    data-parallel ranks exports one series for each. When only some pods are scraped by two
    jobs that add labels of their own, those pods count twice in the mean (`_copies_merged`);
    the queue and the pod count take each pod once."""
    if metrics.running is None:
        return None
    each = _per_target(scope, _gauge(scope, metrics.running, window, summed=False))
    return window_query(_finite_mean(scope.by(), each), span_s, step_s, peak=True,
                        pods=_finite_count(scope.by(), each))


def latency_query(scope: Scope, metrics: EngineMetrics, quantile: float, window: str) -> str:
    latency = metrics.latency
    if isinstance(latency, HistogramLatency | TemplateLatency):
        buckets = (_rate(scope, latency.buckets, window) if isinstance(latency, TemplateLatency)
                   else _rate(scope, f"{latency.name}_bucket", window))
        summed = f"sum by ({scope.by('le')}) ({_per_target(scope, buckets)})"
        quantile_of = f"histogram_quantile({quantile!r}, {summed})"
        if isinstance(latency, HistogramLatency) and latency.to_seconds != 1.0:
            return f"{quantile_of} * {latency.to_seconds!r}"
        return quantile_of
    total = _rate(scope, latency.total, window)
    count = _rate(scope, latency.requests, window)
    return (f"sum by ({scope.by()}) ({_per_target(scope, total)}) / "
            f"sum by ({scope.by()}) ({_per_target(scope, count)}) * {latency.to_seconds!r}")


def latency_floor_query(scope: Scope, metrics: EngineMetrics, window: str) -> str | None:
    """The bucket bounds of each target's latency histogram, one series per target and `le`
    (a preset's histogram only: a template's buckets are the user's). The lowest finite one
    is the finest latency the quantile tells apart, since `histogram_quantile` puts every
    request under it at a fraction of it: vLLM's end-to-end histogram starts at 0.3 s, so a
    P99 of 50 ms reads as 297 ms there."""
    latency = metrics.latency
    if not isinstance(latency, HistogramLatency):
        return None
    # Counted, so copies of several scrape paths change nothing; every label is kept (`le`).
    buckets = _per_target(scope, _gauge(scope, f"{latency.name}_bucket", window, summed=False))
    pod = label_name(scope.pod_label)
    # Only the bounds every pod of the target has: the quantile is taken over the pods'
    # summed buckets, so it tells apart no finer than the coarsest layout. With the finest
    # one's lowest bound (a rollout from an engine version with other buckets), the coarse
    # pods' requests under their lowest bound read as a P99 near it, and counted as breaches.
    pods_with = f"count by ({scope.by('le')}) (count by ({scope.by(pod, 'le')}) ({buckets}))"
    pods = f"count by ({scope.by()}) (count by ({scope.by(pod)}) ({buckets}))"
    return f"{pods_with} == on ({scope.by()}) group_left () {pods}"


def requests_counter(latency: Latency) -> str | Template:
    """The counter of requests the request rate is read from: a histogram's _count, else
    the latency's own."""
    return f"{latency.name}_count" if isinstance(latency, HistogramLatency) else latency.requests


def request_rate_query(scope: Scope, metrics: EngineMetrics, window: str) -> str:
    counter = requests_counter(metrics.latency)
    return f"sum by ({scope.by()}) ({_per_target(scope, _rate(scope, counter, window))})"
