"""The InferenceTuning resource: its target, engine, mode, metrics and every feature section."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator
from pydantic.alias_generators import to_camel, to_snake

from infertune.api.base import (
    ApiModel,
    CrossFieldProblems,
    no_schema_default,
    without_nulls,
)
from infertune.api.canary import CanarySpec
from infertune.api.scaling import (
    AutoscalingSpec,
    BatchingKnob,
    BatchingMode,
    BatchingSpec,
    interval_problem,
)
from infertune.api.status import InferenceTuningStatus
from infertune.api.templates import MAX_TEMPLATE_LENGTH, template_problem
from infertune.api.tuning import AllocatorSpec, MemorySpec, MigSpec, NumaSpec, RetuneSpec
from infertune.api.units import parse_duration
from infertune.keys import label_problem

GROUP = "infertune.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceTuning"
PLURAL = "inferencetunings"
SINGULAR = "inferencetuning"
SHORT_NAMES = ("itune",)
CATEGORIES = ("infertune", "all")

# Kubernetes object and label naming rules (k8s.io/apimachinery/pkg/util/validation).
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


def is_dns_label(text: str) -> bool:
    """A namespace name (or a Service's): DNS_LABEL, at most 63 characters."""
    return len(text) <= 63 and re.fullmatch(DNS_LABEL, text) is not None


def is_dns_subdomain(text: str) -> bool:
    """An object name: DNS_SUBDOMAIN, at most 253 characters."""
    return len(text) <= 253 and re.fullmatch(DNS_SUBDOMAIN, text) is not None

LABEL_NAME = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
# Prometheus metric and label names. Outside spec.metrics.queries (the user's own PromQL,
# api/templates.py) only names are accepted from the spec, so a name can never inject an
# expression into the queries the operator runs.
METRIC_NAME = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
# Names starting with __ are Prometheus' own (__name__, __address__); the queries cannot
# group or select by them.
PROM_WINDOW = r"^[1-9][0-9]*(ms|s|m|h)$"
"""A PromQL range: a whole number above 0 and one unit (ms, s, m, h), as rate() takes it."""
PROM_LABEL_NAME = r"^([a-zA-Z][a-zA-Z0-9_]*|_([a-zA-Z0-9][a-zA-Z0-9_]*)?)$"
MAX_RATE_WINDOW_S = 3600
PROMQL_RESERVED = frozenset({"on", "ignoring", "group_left", "group_right", "bool", "atan2",
                             "inf", "nan", "without"})
"""Words PromQL reads as an operator modifier or a number wherever a bare metric or grouping
label name goes (case-insensitively), so `on{...}`, `by (inf)` or `by (without)` does not
parse (tests/test_promql.py checks the queries with each keyword against promtool)."""
TARGET_LABEL = "infertune_target"
"""The label the operator's queries put each series' Deployment in (from the pod name)."""
STAT_LABEL = "infertune_stat"
"""The label a window query tells its statistics apart by (`last`, `dip`, `samples`...)."""
BUCKET_LABEL = "le"
"""A histogram bucket's upper bound, which the latency queries group by."""


def promql_spelling(name: str) -> str:
    """`name` as a Prometheus scraping over OpenMetrics stores it, the colon written as an
    underscore (the colon trap): the queries read a metric under both spellings."""
    return name.replace(":", "_")


class Engine(StrEnum):
    """The serving engine; it selects the metric names and the batching knob."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TGI = "tgi"
    TRITON = "triton"
    CUSTOM = "custom"


class Mode(StrEnum):
    """Enforce applies decisions; DryRun computes and reports them and changes nothing."""

    ENFORCE = "Enforce"
    DRY_RUN = "DryRun"


# The batching knobs each engine understands (engines.md in the reference notes).
ENGINE_BATCHING_KNOBS: dict[Engine, tuple[BatchingKnob, ...]] = {
    Engine.VLLM: (BatchingKnob.MAX_NUM_SEQS, BatchingKnob.MAX_NUM_BATCHED_TOKENS),
    Engine.SGLANG: (BatchingKnob.MAX_RUNNING_REQUESTS,),
    Engine.TGI: (BatchingKnob.MAX_BATCH_TOTAL_TOKENS, BatchingKnob.MAX_CONCURRENT_REQUESTS),
    Engine.TRITON: (BatchingKnob.MAX_QUEUE_DELAY_MICROSECONDS,),
    Engine.CUSTOM: tuple(BatchingKnob),
}
# The knob driven when spec.batching.knob is unset; engine custom has none.
DEFAULT_BATCHING_KNOB: dict[Engine, BatchingKnob] = {
    Engine.VLLM: BatchingKnob.MAX_NUM_SEQS,
    Engine.SGLANG: BatchingKnob.MAX_RUNNING_REQUESTS,
    Engine.TGI: BatchingKnob.MAX_BATCH_TOTAL_TOKENS,
    Engine.TRITON: BatchingKnob.MAX_QUEUE_DELAY_MICROSECONDS,
}


def batching_knob(batching: BatchingSpec, engine: Engine) -> BatchingKnob | None:
    """The knob batching drives: spec.batching.knob, else the engine's usual one (None for
    engine custom without one)."""
    return batching.knob or DEFAULT_BATCHING_KNOB.get(engine)


class TargetRef(ApiModel):
    """The workload to tune. Only its pods and its scale subresource are touched."""

    api_version: Literal["apps/v1"] = "apps/v1"
    """Always apps/v1."""

    kind: Literal["Deployment"] = "Deployment"
    """Always Deployment."""

    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, min_length=1, max_length=253)]
    """Name of the Deployment, in the namespace of this InferenceTuning."""


class MetricQueries(ApiModel):
    """PromQL templates, one per signal, for metrics that are not a plain gauge or histogram
    per pod (engine custom, or a preset's signal computed differently). Each is evaluated per
    pod: its result must keep the namespace and pod labels (spec.metrics.namespaceLabel and
    podLabel). `$selector` (inside a selector's braces) is replaced by the label matchers of
    the target's pods, `$window` (inside a range's brackets) by spec.metrics.window; every
    other `$` outside a string is refused. A template runs with the operator's access to
    Prometheus."""

    queue_depth: Annotated[str, Field(max_length=MAX_TEMPLATE_LENGTH)] | None = None
    """Requests waiting, per pod. For example
    sum by (namespace, pod) (my_router_queue{$selector})."""

    running: Annotated[str, Field(max_length=MAX_TEMPLATE_LENGTH)] | None = None
    """Requests being served, per pod (batching reads it)."""

    latency_buckets: Annotated[str, Field(max_length=MAX_TEMPLATE_LENGTH)] | None = None
    """The rate of a latency histogram's buckets in seconds, per pod and `le`: the operator
    takes the quantile over the target's pods. For example
    rate(my_latency_seconds_bucket{$selector}[$window]). Needs requestRate."""

    request_rate: Annotated[str, Field(max_length=MAX_TEMPLATE_LENGTH)] | None = None
    """Requests per second, per pod, for latency.minRequestRate. For example
    rate(my_latency_seconds_count{$selector}[$window])."""

    @model_validator(mode="after")
    def _templates(self) -> MetricQueries:
        problems = CrossFieldProblems()
        for field in ("queue_depth", "running", "latency_buckets", "request_rate"):
            text = getattr(self, field)
            problem = None if text is None else template_problem(text)
            if problem is not None:
                problems.add(to_camel(field), problem)
        if (self.latency_buckets is None) != (self.request_rate is None):
            given, missing = (("latencyBuckets", "requestRate") if self.request_rate is None
                              else ("requestRate", "latencyBuckets"))
            problems.add(missing, f"is needed with {given}: the latency and its request rate "
                         "come from the same histogram, so give both templates or neither")
        problems.raise_if_any()
        return self


class LatencyUnit(StrEnum):
    """The unit of a latency histogram's observations and bucket bounds (`le`)."""

    SECONDS = "s"
    MILLISECONDS = "ms"
    MICROSECONDS = "us"

    @property
    def to_seconds(self) -> float:
        return {"s": 1.0, "ms": 1e-3, "us": 1e-6}[self.value]


LATENCY_UNIT_SUFFIXES = {LatencyUnit.MILLISECONDS: ("_ms", "_milliseconds"),
                         LatencyUnit.MICROSECONDS: ("_us", "_microseconds")}
"""The name endings that say a histogram is not in seconds (Triton's
nv_inference_first_response_histogram_ms)."""


class MetricsSpec(ApiModel):
    """Where the engine's metrics are found. Every name overrides the engine preset; with
    engine custom, queueDepth and latencyHistogram are required (a name, or a template in
    queries)."""

    queue_depth: Annotated[str, Field(pattern=METRIC_NAME, max_length=200)] | None = None
    """Gauge of requests waiting per pod, for example vllm:num_requests_waiting."""

    running: Annotated[str, Field(pattern=METRIC_NAME, max_length=200)] | None = None
    """Gauge of requests being served per pod, for example vllm:num_requests_running."""

    latency_histogram: Annotated[str, Field(pattern=METRIC_NAME, max_length=200)] | None = None
    """End-to-end latency histogram, without the _bucket suffix, for example
    vllm:e2e_request_latency_seconds; in seconds unless latencyHistogramUnit says otherwise."""

    latency_histogram_unit: Annotated[LatencyUnit, Field(
        json_schema_extra=no_schema_default)] = LatencyUnit.SECONDS
    """The unit of latencyHistogram's observations and bucket bounds: s (Prometheus'
    convention), ms or us (Triton's nv_inference_first_response_histogram_ms is in ms)."""

    pod_label: Annotated[str, Field(pattern=PROM_LABEL_NAME, max_length=100)] = "pod"
    """The Prometheus label that holds the pod name."""

    namespace_label: Annotated[str, Field(pattern=PROM_LABEL_NAME, max_length=100)] = "namespace"
    """The Prometheus label that holds the namespace."""

    window: Annotated[str, Field(pattern=PROM_WINDOW)] = "1m"
    """The rate() window for latency quantiles and request rates: at least two scrape
    intervals, at most 1h."""

    queries: MetricQueries | None = None
    """PromQL templates for signals a metric name cannot express; each replaces the name (or
    the preset) of its signal."""

    @model_validator(mode="after")
    def _usable_in_promql(self) -> MetricsSpec:
        problems = CrossFieldProblems()
        for field in ("queue_depth", "running", "latency_histogram", "pod_label",
                      "namespace_label"):
            name = getattr(self, field)
            if name is not None and name.lower() in PROMQL_RESERVED:
                problems.add(to_camel(field), f"{name!r} is a PromQL keyword or number, which "
                             "a query cannot use as a name here; rename the metric or the "
                             "label in the exporter or with a relabeling rule")
        if (self.latency_histogram_unit is not LatencyUnit.SECONDS
                and self.latency_histogram is None):
            problems.add("latencyHistogramUnit", f"{self.latency_histogram_unit.value} is the "
                         "unit of latencyHistogram, which is not set (the engines' presets are "
                         "in seconds); name the histogram, or remove the unit")
        if parse_duration(self.window) > MAX_RATE_WINDOW_S:
            problems.add("window", f"{self.window} is longer than 1h; every evaluation computes "
                         "rate() over it for each pod (1m is the default)")
        queries = self.queries
        if queries is not None:
            for name_field, template_field in (("queue_depth", "queue_depth"),
                                               ("running", "running"),
                                               ("latency_histogram", "latency_buckets")):
                if getattr(self, name_field) is not None and \
                        getattr(queries, template_field) is not None:
                    problems.add(to_camel(name_field), "give the metric name or "
                                 f"queries.{to_camel(template_field)}, not both")
        problems.raise_if_any()
        return self


def query_name_problems(metrics: MetricsSpec) -> list[tuple[str, str]]:
    """(field under spec.metrics, problem) for the names the operator's queries cannot use
    that the models take, for `apply_problems`: the previous release took them. A stored
    tuning holding one keeps its pod tuning; its own queries fail (promql.Scope,
    promql.spellings), with the reason in its MetricsAvailable condition."""
    problems = []
    # The latency histogram is read as <name>_bucket, _count and _sum only, never bare.
    for field in ("queue_depth", "running"):
        name = getattr(metrics, field)
        if name is not None and promql_spelling(name).lower() in PROMQL_RESERVED:
            problems.append((to_camel(field), f"{name!r} is read as {promql_spelling(name)!r} "
                             "too (a Prometheus scraping over OpenMetrics stores the colon as "
                             "an underscore), a PromQL keyword, which no query can use as a "
                             "name; rename the metric in the exporter or with a relabeling "
                             "rule"))
    name = metrics.latency_histogram
    if name is not None:
        for unit, endings in LATENCY_UNIT_SUFFIXES.items():
            if name.lower().endswith(endings) and metrics.latency_histogram_unit is not unit:
                # Read in seconds, 150 ms was 150 s: a breach ratio of thousands, and the
                # tuning scaled to maxReplicas.
                problems.append(("latencyHistogramUnit", f"{name!r} says it is in "
                                 f"{unit.name.lower()}, and latencyHistogramUnit is "
                                 f"{metrics.latency_histogram_unit.value}; set "
                                 f"latencyHistogramUnit: {unit.value}"))
    return problems + query_label_problems(metrics.pod_label, metrics.namespace_label)


def query_label_problems(pod_label: str, namespace_label: str) -> list[tuple[str, str]]:
    """(field under spec.metrics, problem) for a pod or namespace label the queries cannot
    read it from; `validate` (through `query_name_problems`) and promql.Scope share it."""
    problems = []
    for field, label, holds in (("podLabel", pod_label, "pod"),
                                ("namespaceLabel", namespace_label, "namespace")):
        problem = query_label_problem(label, holds)
        if problem is not None:
            problems.append((field, problem))
    if pod_label == namespace_label:
        problems.append(("namespaceLabel", f"{namespace_label!r} is podLabel too; the queries "
                         "group by the namespace and the pod, so they must be two labels "
                         "(namespace and pod by default)"))
    return problems


def query_label_problem(label: str, holds: str) -> str | None:
    """Why the operator's queries cannot read the `holds` (pod, namespace) from `label`, or
    None: the queries put labels of their own on their results, and group the latency by
    `le`, so the target's series would collide or never be found."""
    if label in (TARGET_LABEL, STAT_LABEL):
        return (f"{label!r} is a label the operator's queries add to their results "
                f"({TARGET_LABEL}, {STAT_LABEL}), so it cannot hold the {holds}; give the "
                f"label your Prometheus keeps the {holds} in ({holds} by default), relabeled "
                "to another name if it is this one")
    if label == BUCKET_LABEL:
        return (f"'le' is a histogram bucket's bound, which the latency queries group by, so "
                f"it cannot hold the {holds}; give the label your Prometheus keeps the {holds} "
                f"in ({holds} by default)")
    return None


class InferenceTuningSpec(ApiModel):
    """What to tune for one serving Deployment and how to keep its tail latency in the SLO."""

    target_ref: TargetRef
    """The Deployment whose pods are tuned and whose replicas are scaled."""

    engine: Engine
    """The serving engine: vllm, sglang, tgi, triton or custom. It sets the metric preset."""

    mode: Mode = Mode.ENFORCE
    """Enforce applies every decision; DryRun only computes and reports them."""

    container: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] | None = None
    """The serving container in the pod. Unset means the first container."""

    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    """Overrides of the engine's metric names."""

    numa: NumaSpec = Field(default_factory=NumaSpec)
    """NUMA CPU and memory binding."""

    memory: MemorySpec = Field(default_factory=MemorySpec)
    """cgroup v2 memory.high."""

    allocator: AllocatorSpec = Field(default_factory=AllocatorSpec)
    """The memory allocator and its settings."""

    retune: RetuneSpec = Field(default_factory=RetuneSpec)
    """How running pods are brought to a changed tuning."""

    mig: MigSpec | None = None
    """MIG partitioning. Unset means whole GPUs and no partitioning."""

    autoscaling: AutoscalingSpec | None = None
    """Autoscaling on queue depth and latency. Unset means replicas are left alone."""

    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    """Batching tuning."""

    canary: CanarySpec | None = None
    """Canary rollouts of new revisions. Unset means revisions roll out as the Deployment
    says."""

    @model_validator(mode="after")
    def _engine_rules(self) -> InferenceTuningSpec:
        problems = CrossFieldProblems()
        if self.engine is Engine.CUSTOM:
            queries = self.metrics.queries or MetricQueries()
            for field, value, template, example in (
                ("metrics.queueDepth", self.metrics.queue_depth, "queueDepth",
                 "my_engine_queue_size"),
                ("metrics.latencyHistogram", self.metrics.latency_histogram, "latencyBuckets",
                 "my_engine_request_latency_seconds"),
            ):
                if value is None and getattr(queries, to_snake(template)) is None:
                    problems.add(field, "engine custom has no metric preset; name the metric "
                                 f"(for example {example}), or give a PromQL template in "
                                 f"metrics.queries.{template}")
        knob = self.batching.knob
        if knob is not None and knob not in ENGINE_BATCHING_KNOBS[self.engine]:
            valid = ", ".join(k.value for k in ENGINE_BATCHING_KNOBS[self.engine])
            problems.add("batching.knob", f"{knob.value} is not a {self.engine.value} flag; "
                         f"valid: {valid}")
        if self.batching.mode is BatchingMode.AUTO and self.engine is Engine.CUSTOM and (
            knob is None
        ):
            problems.add("batching.knob", "engine custom has no default knob; name one for "
                         "mode Auto")
        problems.raise_if_any()
        return self


MIN_TOKEN_BUDGET = 1024
"""The lowest `batching.min` mode Auto drives a knob counted in tokens with. The bounds default
to request counts (1..256); a token budget that low cannot hold one request: TGI refuses to
start when max-batch-total-tokens is below its max-total-tokens (2048 by default), and vLLM
when max-num-batched-tokens is below max-model-len without chunked prefill."""
TOKEN_KNOBS = frozenset({BatchingKnob.MAX_NUM_BATCHED_TOKENS, BatchingKnob.MAX_BATCH_TOTAL_TOKENS})


def auto_batching_problem(batching: BatchingSpec, knob: BatchingKnob | None,
                          engine: Engine) -> str | None:
    """Why batching mode Auto must not drive `knob` with these bounds (each change it applies
    re-creates the pods), None when it may. Checked when Auto would apply a value, not by the
    spec validation: a stored tuning that validated before must keep its pod tuning (NUMA,
    allocator) after an upgrade; Auto then only recommends, and its reason says why."""
    if knob is None:
        return "engine custom has no default knob; name one in spec.batching.knob"
    if knob is BatchingKnob.MAX_QUEUE_DELAY_MICROSECONDS:
        return ("Triton reads max-queue-delay-microseconds from the model config, not the "
                "command line; set dynamic_batching.max_queue_delay_microseconds yourself, or "
                "use mode Recommend")
    if knob is BatchingKnob.MAX_CONCURRENT_REQUESTS:
        return ("TGI refuses the requests above max-concurrent-requests instead of queueing "
                "them, so lowering it turns latency into errors; use mode Recommend")
    if knob is BatchingKnob.MAX_BATCH_TOTAL_TOKENS and engine is Engine.TGI:
        # TGI's router (backends/v3/src/lib.rs, connect_backend) logs it as deprecated and
        # uses the budget its warmup measured whenever the model reports one.
        bounds = token_bounds_problem(batching, knob)
        return ("TGI ignores --max-batch-total-tokens for Flash Attention models (nearly all "
                "it serves: it sizes the batch from the GPU memory at warmup), so each change "
                "would re-create the pods without effect; use mode Recommend"
                + ("" if bounds is None else f" (and there too, {bounds})")
                + ", or engine custom with its metric names for a model TGI serves without "
                "Flash Attention")
    return token_bounds_problem(batching, knob)


def token_bounds_problem(batching: BatchingSpec, knob: BatchingKnob,
                         named: bool = True) -> str | None:
    """Why min..max cannot bound `knob`, a token budget, None when they can: the defaults
    (1..256) are request counts. `named`: the message names spec.batching.min (not when it
    is given under that field)."""
    if knob in TOKEN_KNOBS and batching.min < MIN_TOKEN_BUDGET:
        field = "spec.batching.min " if named else ""
        return (f"{field}{batching.min} is a request count, but {knob.value} counts "
                "tokens and must hold the longest request (TGI's --max-total-tokens, vLLM's "
                f"--max-model-len without chunked prefill): set min to at least that and at "
                f"least {MIN_TOKEN_BUDGET}, and max above it")
    return None


def _empty_is_unset(value: Any) -> Any:
    return None if value == "" else value


def _nulls_empty(value: Any) -> Any:
    """An annotation given as null is stored empty by the API server."""
    if isinstance(value, dict) and None in value.values():
        return {k: "" if v is None else v for k, v in value.items()}
    return value


class ObjectMeta(ApiModel):
    """The parts of metadata that validation reads; the API server owns the rest."""

    model_config = ApiModel.model_config | {"extra": "allow"}

    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, min_length=1, max_length=253)]
    """Name of the InferenceTuning."""

    namespace: Annotated[Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] | None,
                         BeforeValidator(_empty_is_unset)] = None
    """Namespace; the target Deployment lives in the same one. Empty is unset, as kubectl
    takes it (the namespace of the context, or --namespace)."""

    labels: Annotated[dict[str, str], BeforeValidator(without_nulls)] = Field(
        default_factory=dict)
    annotations: Annotated[dict[str, str], BeforeValidator(_nulls_empty)] = Field(
        default_factory=dict)


def apply_problems(tuning: InferenceTuning) -> list[tuple[str, str]]:
    """(field, problem) for what the API server refuses on apply, or what can never work, in
    a manifest the models accept: for `validate` only. Not in the models: a stored object
    the previous release accepted (a nodeSelector with a space, a podLabel the queries add
    themselves) would become InvalidSpec on upgrade, and its pods untuned; and metadata
    comes from the API server there."""
    problems = [(f"metadata.{field}", "unknown field; remove it")
                for field in sorted(set(tuning.metadata.model_extra or {})
                                    - _OBJECT_META_FIELDS)]
    for key, value in tuning.metadata.labels.items():
        if (problem := label_problem(key, value)) is not None:
            problems.append((f"metadata.labels[{key!r}]", problem))
    for key in tuning.metadata.annotations:
        # The API server checks an annotation key in lower case (IsQualifiedName of
        # strings.ToLower): Team.Example.com/owner is one.
        if (problem := label_problem(key.lower(), "")) is not None:
            problems.append((f"metadata.annotations[{key!r}]", problem.replace(
                "is not a label key", "is not an annotation key").replace(
                repr(key.lower()), repr(key))))
    size = sum(len(key.encode()) + len(value.encode())
               for key, value in tuning.metadata.annotations.items())
    if size > MAX_ANNOTATIONS_BYTES:
        # ValidateAnnotationsSize: keys and values together, in bytes.
        problems.append(("metadata.annotations", f"{size} bytes in all; the API server takes "
                         f"at most {MAX_ANNOTATIONS_BYTES} (keys and values together)"))
    problems += [(f"spec.metrics.{field}", problem)
                 for field, problem in query_name_problems(tuning.spec.metrics)]
    autoscaling = tuning.spec.autoscaling
    if autoscaling is not None and (
            problem := interval_problem(autoscaling.interval)) is not None:
        problems.append(("spec.autoscaling.interval", problem))
    batching = tuning.spec.batching
    if batching.mode is BatchingMode.AUTO and tuning.spec.autoscaling is not None and (
            problem := auto_batching_problem(
                batching, batching_knob(batching, tuning.spec.engine),
                tuning.spec.engine)) is not None:
        # The API server takes it, and the operator then only recommends, for good.
        problems.append(("spec.batching.mode", f"Auto can never apply a value here, only "
                         f"recommend one: {problem}"))
    elif (batching.mode is BatchingMode.RECOMMEND and tuning.spec.autoscaling is not None
          and (knob := batching_knob(batching, tuning.spec.engine)) is not None
          and (problem := token_bounds_problem(batching, knob, named=False)) is not None):
        # Recommended within 1..256, a token budget of 128 that no engine starts with.
        problems.append(("spec.batching.min", problem))
    if tuning.spec.mig is not None:
        for key, value in tuning.spec.mig.node_selector.items():
            if (problem := label_problem(key, value)) is not None:
                # No node carries it: the selector would pick no node, without a word.
                problems.append((f"spec.mig.nodeSelector[{key!r}]",
                                 f"{problem}; no node can have it"))
    return problems


MAX_ANNOTATIONS_BYTES = 256 * 1024
"""The API server's limit on an object's annotations, keys and values together."""
_OBJECT_META_FIELDS = frozenset({
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields"})
"""The fields of a Kubernetes ObjectMeta; the API server refuses others."""


class InferenceTuning(ApiModel):
    """Tunes the infrastructure under one LLM serving Deployment and keeps its P99 in the SLO."""

    api_version: Literal["infertune.io/v1alpha1"] = "infertune.io/v1alpha1"
    kind: Literal["InferenceTuning"] = "InferenceTuning"
    metadata: ObjectMeta
    spec: InferenceTuningSpec
    status: InferenceTuningStatus | None = None

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> InferenceTuning:
        """Parse an object as read from YAML or the API server."""
        return cls.model_validate(manifest)


PRESET_LATENCY_FLOORS_S = {Engine.VLLM: 0.3}
"""The lowest bucket bound of a preset's latency histogram, where the engine fixes it in its
code: vLLM's vllm:e2e_request_latency_seconds starts at 0.3 s (vllm/v1/metrics/loggers.py,
request_latency_buckets). SGLang's can be set (--bucket-e2e-request-latency), and the
operator reads every histogram's bounds from Prometheus at run time as well."""


def latency_target_unresolvable(spec: InferenceTuningSpec) -> str | None:
    """Why spec.autoscaling.latency.target cannot be measured with the engine's own latency
    histogram, for `validate` and a warning when it is applied; None when it can (or the
    histogram is another). Accepted all the same (a finer histogram may come with the next
    release): at run time MetricsAvailable says LatencyTargetBelowResolution, and a latency
    breach is seen only once the quantile reads above the lowest bound."""
    floor = PRESET_LATENCY_FLOORS_S.get(spec.engine)
    autoscaling = spec.autoscaling
    queries = spec.metrics.queries
    if (floor is None or autoscaling is None or spec.metrics.latency_histogram is not None
            or (queries is not None and queries.latency_buckets is not None)):
        return None
    target = autoscaling.latency.target
    if target.seconds >= floor:
        return None
    # Short enough for an admission warning (admission.MAX_WARNING).
    floor_ms = f"{floor * 1000:g}ms"
    return (f"spec.autoscaling.latency.target {target} is under {floor_ms}, the lowest bucket "
            f"of {spec.engine.value}'s latency histogram, and cannot be measured "
            f"(LatencyTargetBelowResolution); set {floor_ms} or more, or a finer "
            "spec.metrics.latencyHistogram")
