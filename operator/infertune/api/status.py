"""The status the operator writes: conditions, phase, recent decisions and one block per feature.

Every block is optional so an operator that has only done part of its work (or an older one)
still writes a valid status, and a restarted operator resumes from what is here.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field

from infertune.api.base import ApiModel
from infertune.api.scaling import (
    MAX_BREACHES,
    MAX_PERIOD_S,
    MAX_STABILIZATION_S,
    MIN_INTERVAL_S,
)

MAX_DECISIONS = 10
"""Decisions kept in status; older ones are in the Events."""


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """The condition types the operator sets."""

    READY = "Ready"
    DRY_RUN = "DryRun"
    TARGET_FOUND = "TargetFound"
    METRICS_AVAILABLE = "MetricsAvailable"
    SCALING_ACTIVE = "ScalingActive"
    SCALING_LIMITED = "ScalingLimited"
    CANARY_HEALTHY = "CanaryHealthy"


class Condition(ApiModel):
    """A condition as Kubernetes API conventions define it (metav1.Condition)."""

    type: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9]*$", max_length=316)]
    """The aspect it describes, for example Ready."""

    status: ConditionStatus
    """True, False or Unknown."""

    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The metadata.generation the condition was computed from."""

    last_transition_time: str
    """When status last changed (RFC 3339)."""

    reason: Annotated[str, Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
                                 max_length=1024)]
    """A CamelCase reason for the last transition, for example TargetNotFound."""

    message: Annotated[str, Field(max_length=32768)] = ""
    """What happened and what to do, for people."""


class Phase(StrEnum):
    """A one-word summary of Ready and DryRun, for kubectl and dashboards: whether the spec
    is accepted for its Deployment (the autoscaler's state is ScalingActive, the SCALING
    column; the pods' is status.tuning)."""

    PENDING = "Pending"
    ACTIVE = "Active"
    DRY_RUN = "DryRun"
    ERROR = "Error"


class Decision(ApiModel):
    """One decision the operator made (or, in DryRun, would have made), with its reason."""

    time: str
    """When it was made (RFC 3339)."""

    feature: Annotated[str, Field(max_length=63)]
    """Which part of the operator decided: controller (the spec and its target) or
    autoscaling."""

    action: Annotated[str, Field(max_length=253)]
    """What was done, for example "scale 3 -> 5"."""

    reason: Annotated[str, Field(max_length=1024)]
    """Why, with the numbers that led to it."""

    applied: bool = True
    """False when it was only computed (DryRun, or held back by a rule)."""


class TuningStatus(ApiModel):
    """Pod tuning at admission."""

    revision: str | None = None
    """Hash of the tuning-relevant spec that pods are tuned to."""

    tuned_pods: Annotated[int, Field(ge=0)] = 0
    """Pods of the target carrying the current revision."""

    outdated_pods: Annotated[int, Field(ge=0)] = 0
    """Pods tuned to an older revision or not tuned, waiting to be re-created."""

    message: str = ""
    """What re-tuning is doing, or why it is not replacing pods."""

    problems: list[str] = Field(default_factory=list, max_length=20)
    """What the most recently admitted pods could not get, and why (for example a container
    without a command cannot be wrapped by the NUMA launcher)."""


class MigNodeStatus(ApiModel):
    node: str
    """Node name."""

    config: str
    """The nvidia.com/mig.config value asked for."""

    state: str = "pending"
    """configured, pending, waiting, busy, draining, claimed (labelled for another tuning
    that selects the node too), failed or timed-out, from nvidia.com/mig.config.state as
    mig-manager reports it."""

    message: str = ""


class MigStatus(ApiModel):
    """MIG partitioning."""

    profile: str | None = None
    """The MIG profile the pods request."""

    layout: list[str] = Field(default_factory=list)
    """The per-GPU layout, for example ["3g.71gb", "3g.71gb"]."""

    strategy: str | None = None
    """The GPU Operator's MIG strategy on the selected nodes (nvidia.com/mig.strategy)."""

    config_map: str | None = None
    """namespace/name of the mig-parted ConfigMap the GPU Operator reads."""

    nodes: list[MigNodeStatus] = Field(default_factory=list)
    """Nodes being partitioned and their state."""

    message: str = ""
    """The last step taken, or why nothing is labelled."""


class RecommendationRecord(ApiModel):
    time: str
    replicas: Annotated[int, Field(ge=0)]


class ScaleEventRecord(ApiModel):
    time: str
    change: int


MAX_RECOMMENDATIONS = MAX_STABILIZATION_S // MIN_INTERVAL_S + 1
"""One recommendation per evaluation, kept for the longest stabilization window: the most a
state can hold (pruning keeps far fewer unless the load keeps changing)."""
MAX_SCALE_EVENTS = MAX_PERIOD_S // MIN_INTERVAL_S + 1
"""At most one replica change per evaluation, kept for the longest rate-limit period. With
500 before, a 1s interval scaling every second for a 30m period passed it, and the API server
refused every status patch after the replicas were written."""


class ServingRecord(ApiModel):
    replicas: Annotated[int, Field(ge=0)]
    """The most that were Ready at once since, never more than the replicas since."""
    of: Annotated[int, Field(ge=0)]
    """The Deployment's replicas when they were counted."""
    since: str
    """Since when both have been as they are; after 10 minutes short of the replicas
    without a change, every replica counts."""
    changed: str | None = None
    """When the pods that serve last changed (Ready pods joined, a scale-in removed some): a
    latency sample reaching back before it is not counted as a breach."""


class BreachRecord(ApiModel):
    time: str
    """When it last mattered (the breach, or the last scale-in it limited); kept for
    latency.breachMemory after it, and at most 24h after `since`."""
    since: str | None = None
    """When the latency breached; left out: at `time`."""
    doubted: str | None = None
    """When a breach at a load per replica the latency was fine at since was taken for a
    burst and not remembered (a second one within breachMemory is)."""
    request_rate: Annotated[float, Field(gt=0)]
    """Requests per second across the Deployment then."""
    replicas: Annotated[int, Field(ge=1)]
    """The replicas serving then; no scale-in leaves them carrying that rate per replica
    again."""
    target: str
    """latency.target then (a breach of another target or quantile no longer counts)."""
    quantile: float
    """latency.quantile then."""
    outcome: Literal["Open", "Cured", "NotLoad"] = "Open"
    """Open until a latency at or under the target is measured on the pods then serving;
    Cured after that; NotLoad when the replicas added did not lower it (it is not the
    load's, and is forgotten once cured)."""
    latency_seconds: Annotated[float, Field(ge=0)]
    """The latency then (0: not known)."""
    healthy_per_replica: Annotated[float, Field(ge=0)]
    """The most requests per second per replica under the breach's that the latency was
    measured at or under the target with since (0: none): a scale-in goes halfway between
    it and the breach's."""
    queue_overloaded: str | None = None
    """When the queue last stayed above its target at a lower rate per replica than the
    breach's (a scale-in the breach allowed left too few replicas): requestRate and replicas
    are then that overload's, the most a replica is known not to carry. Left out: they are
    the breach's."""


class QueueRecord(ApiModel):
    time: str
    """When the last evaluation that had the queue read it."""
    waiting: Annotated[float, Field(ge=0)]
    """Requests waiting across the pods that reported it."""
    pods: Annotated[int, Field(ge=1)]
    """The pods that reported it (the replicas when not known)."""
    replicas: Annotated[int, Field(ge=0)]
    """The Deployment's replicas then."""
    fell: str | None = None
    """When the requests waiting were last seen falling from twice the target or more, at
    two evaluations in a row or more, by more than 10%, with no replica taken away and no
    pod missing: the replicas drained a backlog, and a latency above target whose samples
    reach back to it is that backlog's (it adds no replicas, changes no batch and is not
    remembered). Left out: never seen so."""
    falling_from: Annotated[float, Field(ge=0)] | None = None
    """The requests waiting when the fall this reading is part of began; left out: this
    reading found no fewer than the one before."""


class CarriedRecord(ApiModel):
    per_replica: Annotated[float, Field(gt=0)]
    """Requests per second per serving replica."""
    time: str
    """When it was measured, or last renewed by a reading within the tolerance under it; kept
    for latency.breachMemory after that (a higher reading takes its place), then taken again
    from the next reading measured fine."""
    target: str
    """latency.target then (measured for another target or quantile, it no longer counts)."""
    quantile: float
    """latency.quantile then."""
    failed: str | None = None
    """When the latency last breached with the load's since: no scale-in takes a replica away
    beyond what the rate needs for latency.breachMemory after it. Left out: none."""


class AutoscalingState(ApiModel):
    """What the decision engine remembers, so a restarted operator decides the same way."""

    recommendations: list[RecommendationRecord] = Field(default_factory=list,
                                                        max_length=MAX_RECOMMENDATIONS)
    """Recommendations that can still decide a stabilization window (the highest for scaling
    down, the lowest for scaling up); one that a later recommendation matches both ways is
    dropped, so a steady load keeps one."""
    scale_events: list[ScaleEventRecord] = Field(default_factory=list,
                                                 max_length=MAX_SCALE_EVENTS)
    """Recent replica changes, for the scale-up and scale-down rate limits."""
    metrics_missing_since: str | None = None
    serving: ServingRecord | None = None
    """The replicas known to serve, on which a latency breach is sized (pods added later
    join once Ready)."""
    latency_breaches: list[BreachRecord] = Field(default_factory=list,
                                                  max_length=MAX_BREACHES)
    """Latency breaches within latency.breachMemory, which limit scaling in: the one at the
    lowest request rate per replica, and beside it the newest when it is higher, or the
    lowest before it where the newest is the lowest."""
    queue: QueueRecord | None = None
    """The queue at the last evaluation that read it, to tell a backlog the replicas drain
    from the load they carry."""
    carried: CarriedRecord | None = None
    """The most requests per second per replica the latency was measured at or under its
    target with (the queue not above its own) within latency.breachMemory: a scale-in leaves
    each replica at most the tolerance more than that, and always one replica fewer at
    least; left out: none measured."""


class ReplicaFight(ApiModel):
    """Another writer reverting the replicas the operator wrote (controller/fights.py)."""

    reverts: Annotated[int, Field(ge=1)]
    """Reverts seen in this fight."""
    since: str
    """When the first revert of this fight was seen (RFC 3339)."""
    last_revert: str
    observed_generation: Annotated[int, Field(ge=0)]
    """The tuning's generation at the last revert; a spec change ends the fight."""
    retry_at: str | None = None
    """Replicas are not written until then; unset while still writing."""
    by: str | None = None
    """Who set the replicas at the last revert, as the Deployment's managedFields say (its
    field manager, and the subresource it wrote through)."""


class AutoscalingStatus(ApiModel):
    """The last autoscaling evaluation."""

    current_replicas: Annotated[int, Field(ge=0)] | None = None
    """Replicas of the target at the last evaluation."""

    desired_replicas: Annotated[int, Field(ge=0)] | None = None
    """Replicas the last evaluation asked for."""

    p99_ms: float | None = None
    """The latency quantile the last evaluation saw, in milliseconds."""

    p99: str | None = None
    """The same latency in milliseconds (for example 312ms or 75.4ms), for kubectl: to a
    tenth, finer where it would read as the target it is not."""

    queue_depth: float | None = None
    """Mean requests waiting per replica at the last evaluation."""

    last_scale_time: str | None = None
    """When replicas were last changed (RFC 3339)."""

    breaches: Annotated[int, Field(ge=0)] = 0
    """Consecutive samples above the latency target."""

    reason: str = ""
    """Why the last evaluation decided what it did."""

    action: str | None = None
    """ScaleOut, ScaleIn, Hold, TuneBatching, Fallback or Disabled."""

    latency_kind: str | None = None
    """Which latency p99 and p99Ms show: a quantile such as p99, or mean (Triton)."""

    evaluated: str | None = None
    """When the last evaluation ran (RFC 3339)."""

    state: AutoscalingState | None = None
    target: str | None = None
    """The Deployment `state` was recorded for: after spec.targetRef changes, the new target
    starts with an empty state (the old one's scale events and recommendations do not hold
    its rate limits or stabilization)."""
    replica_fight: ReplicaFight | None = None
    """Set while another writer fights the operator over replicas."""

    written_replicas: Annotated[int, Field(ge=0)] | None = None
    """Replicas the operator wrote last, while they stand: a change from them by another
    writer is a revert (a replica fight), also for an operator restarted in between. Unset
    once changed."""

    written_target: str | None = None
    """The Deployment writtenReplicas were written to: after spec.targetRef changes, the new
    target's count is not taken for a revert."""


class BatchingIgnored(ApiModel):
    """Mode Auto: a value the pods were seen to run past, so the engine did not take the
    flag the webhook set."""

    knob: str
    """The engine flag, for example max-num-seqs."""
    value: int
    """The value applied, which every pod ran when it was seen."""
    peak: float
    """The most requests an engine ran at once over the queue's sustain window, above
    `value`."""
    since: str
    """When it was seen."""
    container: str | None = None
    """A digest of the serving container's image, command, args and environment then: mode
    Auto applies values again once they change."""


class BatchingStatus(ApiModel):
    """Batching recommendation, and in mode Auto the value pods are tuned with."""

    knob: str | None = None
    """The engine flag, for example max-num-seqs."""
    current: int | None = None
    """The value the step starts from, when the operator knows it: in mode Auto the value
    applied, else the value on the Deployment's pod template."""
    recommended: int | None = None
    """What the latency and queue history suggest now."""
    applied: int | None = None
    """Mode Auto: the value the webhook sets on new pods (re-tuning replaces the others). It
    follows the recommendation only when that moves by 25% or more, so pods are not churned."""
    applied_since: str | None = None
    """Mode Auto: when the applied value was set. A latency breach that mode Auto hands to
    batching stops waiting for it 10 minutes later if the pods still do not run it
    (latency.action Auto then scales out)."""
    serving_since: str | None = None
    """Mode Auto: since when re-tuning counts every pod at the applied value."""
    ready_since: str | None = None
    """Mode Auto: since when every replica has also been Ready with it. The next step waits
    until the metrics window, the latency samples and the queue's sustain window lie after
    this time."""
    breached: int | None = None
    """Mode Auto: the lowest value the latency breached at, which it lowered the knob from;
    raises stay under it until breachedUntil."""
    breached_until: str | None = None
    """Until when `breached` caps the raises (an hour after the breach)."""
    ignored: BatchingIgnored | None = None
    """Mode Auto, knobs counted in requests: the engine ran more requests at once than the
    value applied allows, so it does not read the flag from the container's arguments (an
    entrypoint script that drops them). Mode Auto then only recommends, until the
    container's image, command, args or environment change (or mode Auto is left)."""
    reason: str = ""


class CanaryPhase(StrEnum):
    IDLE = "Idle"
    PROGRESSING = "Progressing"
    PROMOTING = "Promoting"
    SUCCEEDED = "Succeeded"
    ROLLING_BACK = "RollingBack"
    FAILED = "Failed"


class CanaryStatus(ApiModel):
    """The canary rollout state; everything a restarted operator needs to resume."""

    phase: CanaryPhase = CanaryPhase.IDLE
    step: Annotated[int, Field(ge=0)] = 0
    """Index of the current step in spec.canary.steps."""

    weight: Annotated[int, Field(ge=0, le=100)] = 0
    """Percent of traffic on the canary."""

    canary_revision: str | None = None
    primary_revision: str | None = None
    failed_checks: Annotated[int, Field(ge=0)] = 0
    step_started: str | None = None
    """When the current step started (RFC 3339)."""

    message: str = ""


def _free_form(schema: dict[str, Any]) -> None:
    """An object the API server keeps as it is given (a stored spec of any version)."""
    schema.clear()
    schema.update({"type": "object", "x-kubernetes-preserve-unknown-fields": True})


class AppliedSpec(ApiModel):
    """The newest spec the operator found valid, as stored. While a newer generation is
    invalid (Ready=False, InvalidSpec), the pod webhook tunes new pods as this one says, as if
    the invalid edit had been refused: left untuned, every pod a scale-out or a lost node
    re-created lost its NUMA binding and allocator because of a typo in another section."""

    generation: Annotated[int, Field(ge=1)]
    """The metadata.generation of `spec`."""

    spec: Annotated[dict[str, Any], Field(json_schema_extra=_free_form)]


class InferenceTuningStatus(ApiModel):
    """What the operator observed and did."""

    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The metadata.generation this status reflects."""

    phase: Phase = Phase.PENDING
    conditions: list[Condition] = Field(default_factory=list)
    decisions: list[Decision] = Field(default_factory=list, max_length=MAX_DECISIONS)
    """The most recent decisions, newest last."""

    tuning: TuningStatus | None = None
    mig: MigStatus | None = None
    autoscaling: AutoscalingStatus | None = None
    batching: BatchingStatus | None = None
    canary: CanaryStatus | None = None
    applied_spec: AppliedSpec | None = None
    """The spec the pod webhook tunes pods by while the stored one is invalid."""
