"""Spec sections for the dual-metric autoscaler and batching tuning."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from infertune.api.base import (
    FLAG,
    NUMBER,
    ApiModel,
    CrossFieldProblems,
    int64,
    no_schema_default,
)
from infertune.api.units import Duration, parse_duration

MAX_SUSTAIN_S = 600
MAX_PERIOD_S = 1800
STARTING_S = 600
"""How long the replicas known to serve may stay short of the Deployment's replicas without
changing before every replica counts again (engine._track_serving): a pod Pending for a GPU
that does not come, a crash loop, or readiness that flaps under overload must not hold a
latency breach for ever."""
MAX_STABILIZATION_S = 3600
MAX_INTERVAL_S = 3600
MIN_INTERVAL_S = 1
MAX_CONSECUTIVE_SAMPLES = 100
MAX_BREACH_MEMORY_S = 86400
MAX_BREACHES = 2
"""Latency breaches remembered (scaling.state.ScalingState.breaches): the lowest rate per
replica, and beside it the newest when it is higher (it takes over when the lowest is
forgotten), or the lowest of the load's before it where the newest is the lowest (it takes
over when the newest turns out not to say what a replica carries)."""


class QueueSignal(ApiModel):
    """Scale out on request-queue depth (for example vllm:num_requests_waiting)."""

    target_per_replica: Annotated[float, Field(gt=0), NUMBER] = 32
    """Waiting requests per replica above which the Deployment scales out. The incident's
    rule: queue depth above 32."""

    sustain: Duration = Duration("30s")
    """How long the queue must stay above target before scaling out (the incident: 30s). At
    most 10m: the window is read at the queue's resolution (1s) in every evaluation."""

    @model_validator(mode="after")
    def _sustain_bounded(self) -> QueueSignal:
        if self.sustain.seconds > MAX_SUSTAIN_S:
            problems = CrossFieldProblems()
            problems.add("sustain", f"{self.sustain} is too long: Prometheus reads the queue "
                         "at 1s steps over the whole window in every evaluation; use at most "
                         "10m (for a slower scale-up, raise scaleUp.stabilization)")
            problems.raise_if_any()
        return self


class LatencyAction(StrEnum):
    """What a latency breach does."""

    AUTO = "Auto"
    SCALE_OUT = "ScaleOut"
    TUNE_BATCHING = "TuneBatching"


class LatencySignal(ApiModel):
    """Act on a latency quantile of end-to-end request latency."""

    quantile: Annotated[float, Field(gt=0, lt=1), NUMBER] = 0.99
    """The quantile to watch, for example 0.99 for P99."""

    target: Duration = Duration("75ms")
    """Latency above which the signal counts a breach (the incident: P99 above 75ms)."""

    consecutive_samples: Annotated[int, Field(ge=1, le=MAX_CONSECUTIVE_SAMPLES), NUMBER] = 2
    """Breaches in a row, one per evaluation interval, before acting (the incident: 2)."""

    action: LatencyAction = LatencyAction.AUTO
    """ScaleOut adds replicas; TuneBatching changes the batching knob; Auto scales out when the
    queue is above target and tunes batching when it is not (the latency then comes from
    batching, not from load)."""

    min_request_rate: Annotated[float, Field(ge=0), NUMBER] = 1.0
    """Requests per second across the target below which the quantile is treated as noise."""

    breach_memory: Annotated[Duration, Field(
        json_schema_extra=no_schema_default)] = Duration("1h")
    """How long a breach limits scaling in after it: no scale-in leaves the replicas carrying
    the request rate per replica at which the latency breached (less the tolerance), so the
    queue does not take away the replicas a breach needed and breach again. Counted from
    the breach or the last scale-in it limited, whichever is later, and never more than 24h
    after the breach; 0s turns the limit off. At most 24h."""

    @model_validator(mode="after")
    def _target_above_zero(self) -> LatencySignal:
        problems = CrossFieldProblems()
        if self.target.seconds <= 0:
            problems.add("target", f"{self.target} would count every request as a breach and "
                         "sizes replicas by dividing by it; use a latency above 0, for example "
                         "75ms")
        if self.breach_memory.seconds > MAX_BREACH_MEMORY_S:
            problems.add("breachMemory", f"{self.breach_memory} is longer than 24h; a "
                         "breach that old says little of the load the replicas carry now "
                         "(1h is the default)")
        problems.raise_if_any()
        return self


class SelectPolicy(StrEnum):
    """Which of the two rate limits applies, as HPA's behavior `selectPolicy`."""

    MAX = "Max"
    """The limit that allows the larger change (HPA's default)."""
    MIN = "Min"
    """The limit that allows the smaller change."""
    DISABLED = "Disabled"
    """No scaling in this direction at all (the bounds are still enforced)."""


class ScalingRules(ApiModel):
    """Rate limits for one direction, in the style of HPA behavior policies. Every field left
    out keeps its default, `pods` and `percent` included: with selectPolicy Max the larger of
    the two changes is allowed, so `{pods: 2}` alone still allows +100%; say `percent: 0`
    (or selectPolicy Min) to allow only the 2."""

    pods: Annotated[int, Field(ge=0, le=10000), NUMBER]
    """At most this many pods added or removed per period (0 disables this limit)."""

    percent: Annotated[int, Field(ge=0, le=1000), NUMBER]
    """At most this percentage of the current replicas per period (0 disables this limit)."""

    select_policy: Annotated[SelectPolicy, Field(
        json_schema_extra=no_schema_default)] = SelectPolicy.MAX
    """Max (default): when both limits are set, the larger change is allowed, as HPA's
    default; Min: the smaller one; Disabled: replicas never change in this direction on the
    metrics, as with HPA (`scaleDown.selectPolicy: Disabled` keeps every replica that was
    added). A count outside minReplicas..maxReplicas is still brought inside."""

    period: Duration = Duration("15s")
    """The period the limits apply to."""

    stabilization: Duration
    """The window over which the highest (scale-down) or lowest (scale-up) recommendation wins,
    so a brief dip or spike does not move replicas."""

    @model_validator(mode="after")
    def _some_limit(self) -> ScalingRules:
        problems = CrossFieldProblems()
        limited = self.select_policy is not SelectPolicy.DISABLED
        if self.pods == 0 and self.percent == 0 and limited:
            problems.add("pods", "pods and percent are both 0, so replicas could never change "
                         "in this direction; set at least one of them above 0, or "
                         "selectPolicy: Disabled to say so")
        if not 0 < self.period.seconds <= MAX_PERIOD_S:
            problems.add("period", f"{self.period} is outside 1ms..30m (HPA allows up to "
                         "1800s); for example 15s")
        if self.stabilization.seconds > MAX_STABILIZATION_S:
            problems.add("stabilization", f"{self.stabilization} is longer than 1h (HPA's "
                         "limit too); every evaluation reads the recommendations of the window")
        problems.raise_if_any()
        return self


class ScaleUpRules(ScalingRules):
    """Scale-up rate limits and stabilization; HPA's defaults: max(+4 pods, +100%) per 15s, no
    stabilization (kubernetes.io)."""

    pods: Annotated[int, Field(ge=0, le=10000), NUMBER] = 4
    """At most this many pods added per period (0 disables this limit)."""

    percent: Annotated[int, Field(ge=0, le=1000), NUMBER] = 100
    """At most this percentage of the current replicas added per period (0 disables this
    limit)."""

    stabilization: Duration = Duration("0s")
    """The window over which the lowest recommendation wins, so a brief spike does not add
    replicas (default 0s: scale up at once)."""


class ScaleDownRules(ScalingRules):
    """Scale-down rate limits and stabilization; HPA's defaults: 100% per 15s after a 300s
    stabilization window."""

    pods: Annotated[int, Field(ge=0, le=10000), NUMBER] = 0
    """At most this many pods removed per period (0, the default, disables this limit)."""

    percent: Annotated[int, Field(ge=0, le=1000), NUMBER] = 100
    """At most this percentage of the current replicas removed per period (0 disables this
    limit)."""

    stabilization: Duration = Duration("300s")
    """The window over which the highest recommendation wins, so a brief dip does not remove
    replicas (default 300s)."""


class MetricsUnavailableAction(StrEnum):
    """What the autoscaler does while its metrics are missing."""

    HOLD = "Hold"
    FALLBACK = "Fallback"


class MetricsUnavailable(ApiModel):
    """Behaviour when Prometheus is down or returns no data. Replicas never go down on missing
    data, whichever action is chosen."""

    action: MetricsUnavailableAction = MetricsUnavailableAction.HOLD
    """Hold keeps the current replicas. Fallback raises replicas to fallbackReplicas (never
    lowers them) once data has been missing for `after`."""

    fallback_replicas: Annotated[int, Field(ge=1), NUMBER, AfterValidator(int64)] | None = None
    """Replicas to run with action Fallback."""

    after: Duration = Duration("2m")
    """How long data must be missing before Fallback applies."""

    @model_validator(mode="after")
    def _fallback_needs_replicas(self) -> MetricsUnavailable:
        problems = CrossFieldProblems()
        if self.action is MetricsUnavailableAction.FALLBACK and self.fallback_replicas is None:
            problems.add("fallbackReplicas", "action Fallback needs fallbackReplicas")
        if self.action is MetricsUnavailableAction.HOLD and self.fallback_replicas is not None:
            problems.add("fallbackReplicas", "is only used with action Fallback; remove it or "
                         "set action: Fallback")
        problems.raise_if_any()
        return self


class AutoscalingSpec(ApiModel):
    """Autoscaling of the target Deployment on queue depth and a latency quantile."""

    enabled: Annotated[bool, FLAG] = True
    """Set to false to keep the section but stop scaling."""

    # Within an int64 (canary.minRequestCount says why not as a `maximum`): beyond it, the
    # API server refuses the number, and `validate` said it was above maxReplicas.
    min_replicas: Annotated[int, Field(ge=1), NUMBER, AfterValidator(int64)] = 1
    """Replicas never go below this."""

    max_replicas: Annotated[int, Field(ge=1, le=10000), NUMBER] = 10
    """Replicas never go above this."""

    interval: Duration = Duration("15s")
    """How often the signals are evaluated."""

    tolerance: Annotated[float, Field(ge=0, lt=1), NUMBER] = 0.1
    """Ratio band around 1.0 in which no scaling happens (HPA's default tolerance)."""

    queue: QueueSignal = Field(default_factory=QueueSignal)
    """The queue-depth signal."""

    latency: LatencySignal = Field(default_factory=LatencySignal)
    """The latency-quantile signal."""

    scale_up: ScaleUpRules = Field(default_factory=ScaleUpRules)
    """Scale-up rate limits and stabilization (fields left out keep HPA's defaults)."""

    scale_down: ScaleDownRules = Field(default_factory=ScaleDownRules)
    """Scale-down rate limits and stabilization (fields left out keep HPA's defaults)."""

    metrics_unavailable: MetricsUnavailable = Field(default_factory=MetricsUnavailable)
    """Behaviour when metrics are missing."""

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        problems = CrossFieldProblems()
        if self.min_replicas > self.max_replicas:
            problems.add("minReplicas", f"{self.min_replicas} is above maxReplicas "
                         f"{self.max_replicas}; lower minReplicas or raise maxReplicas")
        if self.interval.seconds < MIN_INTERVAL_S:
            problems.add("interval", f"{self.interval} is too short; Prometheus scrapes every "
                         "few seconds, use 1s or more (15s is the default)")
        elif self.interval.seconds > MAX_INTERVAL_S:
            problems.add("interval", f"{self.interval} is longer than 1h; replicas would "
                         "follow the load hours late (15s is the default)")
        fallback = self.metrics_unavailable.fallback_replicas
        if fallback is not None and not self.min_replicas <= fallback <= self.max_replicas:
            problems.add("metricsUnavailable.fallbackReplicas", f"{fallback} is outside "
                         f"minReplicas..maxReplicas ({self.min_replicas}..{self.max_replicas})")
        problems.raise_if_any()
        return self


def interval_problem(interval: Duration) -> str | None:
    """Why `interval` cannot be the latency query's step, or None; for `apply_problems`, not
    the model: the previous release took it, and a stored tuning holding one keeps its pod
    tuning (plan.unsupported fails its own queries, with the reason in MetricsAvailable)."""
    if parse_duration(interval) % Decimal("0.001"):
        # Prometheus keeps time in milliseconds: a finer step puts the points beside the
        # evaluation time, read as stale for ever.
        return (f"{interval} is not a whole number of milliseconds, the finest time "
                "Prometheus keeps; round it (for example 1500ms)")
    return None


class BatchingMode(StrEnum):
    """How batching is tuned when latency comes from batching rather than load."""

    OFF = "Off"
    RECOMMEND = "Recommend"
    AUTO = "Auto"


BATCHING_UNUSED = ("not acted on without spec.autoscaling: its evaluations recommend and apply "
                   "the batch size; add spec.autoscaling (with enabled: false it recommends "
                   "without scaling), or set spec.batching.mode: Off")
"""Said of a spec.batching in Recommend or Auto without spec.autoscaling wherever a spec is
judged (the Ready condition, `infertune validate`, the admission warning): accepted, and
nothing reads it."""


def batching_unused(spec: object) -> bool:
    """Whether a spec (the model, or a raw mapping as admission sees it) asks for batching
    (mode Recommend or Auto) without spec.autoscaling, which alone acts on it."""
    if isinstance(spec, Mapping):
        batching, autoscaling = spec.get("batching"), spec.get("autoscaling")
        mode = batching.get("mode") if isinstance(batching, Mapping) else None
    else:
        autoscaling = getattr(spec, "autoscaling", None)
        mode = getattr(getattr(spec, "batching", None), "mode", None)
    # `autoscaling: {}` is the section with its defaults, as the models read it.
    return mode in (BatchingMode.RECOMMEND, BatchingMode.AUTO) and autoscaling is None


class BatchingKnob(StrEnum):
    """The engine flag that batching tuning drives."""

    MAX_NUM_SEQS = "max-num-seqs"
    MAX_NUM_BATCHED_TOKENS = "max-num-batched-tokens"
    MAX_RUNNING_REQUESTS = "max-running-requests"
    MAX_BATCH_TOTAL_TOKENS = "max-batch-total-tokens"
    MAX_CONCURRENT_REQUESTS = "max-concurrent-requests"
    MAX_QUEUE_DELAY_MICROSECONDS = "max-queue-delay-microseconds"


MOST_REPLICAS = 2**31 - 1
"""The most replicas a Deployment can have: its spec.replicas is a 32-bit integer."""

MAX_KNOB = 2**31 - 1
"""The largest batching value: every engine's knob takes it (TGI's token count is a u32), and
a larger one overflowed the recommender's arithmetic (a 400-digit max was valid)."""


class BatchingSpec(ApiModel):
    """Batching tuning: recommend or apply a batch-size knob within bounds."""

    mode: BatchingMode = BatchingMode.OFF
    """Off does nothing; Recommend writes a recommendation to status; Auto applies it through
    the re-tune path, within min and max."""

    knob: BatchingKnob | None = None
    """The flag to drive. Unset means the engine's usual one: max-num-seqs (vLLM),
    max-running-requests (SGLang), max-batch-total-tokens (TGI),
    max-queue-delay-microseconds (Triton)."""

    min: Annotated[int, Field(ge=1, le=MAX_KNOB), NUMBER] = 1
    """The knob is never set below this."""

    max: Annotated[int, Field(ge=1, le=MAX_KNOB), NUMBER] = 256
    """The knob is never set above this."""

    @model_validator(mode="after")
    def _bounds(self) -> BatchingSpec:
        problems = CrossFieldProblems()
        if self.min > self.max:
            problems.add("min", f"{self.min} is above max {self.max}")
        problems.raise_if_any()
        return self
