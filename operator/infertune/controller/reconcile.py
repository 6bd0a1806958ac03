"""What the operator reports about one InferenceTuning, as a pure function of what it sees.

The kopf handler reads the object and its target, calls `assess`, and writes the result; the
same function answers the same way in tests, with no cluster and no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from infertune.api.canary import CANARY_NOT_ENFORCED
from infertune.api.errors import validate_stored
from infertune.api.scaling import BATCHING_UNUSED, batching_unused
from infertune.api.spec import InferenceTuningSpec, Mode
from infertune.api.status import (
    MAX_DECISIONS,
    AppliedSpec,
    AutoscalingStatus,
    Condition,
    ConditionStatus,
    ConditionType,
    Decision,
    InferenceTuningStatus,
)
from infertune.controller.conditions import (
    MAX_EVENT_MESSAGE,
    NOT_EVALUATED,
    find,
    make_condition,
    merge_condition_dicts,
    phase_of,
    set_condition,
)
from infertune.controller.spec_cache import applied_spec
from infertune.tuning.pod_mig import mig_off

RETRY_TARGET_SECONDS = 15.0
"""How soon a missing target Deployment is looked for again."""
MAX_DECISION_REASON = 1024
"""Decision.reason's limit (api/status.py)."""
TARGET_NOT_FOUND = "TargetNotFound"
CONTAINER_NOT_FOUND = "ContainerNotFound"
ACCEPTED = "Accepted"
"""The Ready reason of a tuning whose Deployment does not exist."""



@dataclass(frozen=True)
class TargetState:
    """What the operator needs to know about the target Deployment."""

    name: str
    replicas: int
    containers: tuple[str, ...]


@dataclass(frozen=True)
class Notice:
    """An Event to post on the InferenceTuning."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


OWNED = ("observedGeneration", "phase", "conditions", "decisions")
"""The status fields the controller writes. The blocks of the loops and of the autoscaler
(tuning, mig, autoscaling, batching) are theirs: a copy of one written back from the event the
controller handled could undo a newer write (an autoscaler's scale event, say)."""
SHARED = ("conditions", "decisions")
AUTOSCALER_CONDITIONS = (ConditionType.SCALING_ACTIVE.value,
                         ConditionType.METRICS_AVAILABLE.value,
                         ConditionType.SCALING_LIMITED.value)
"""The conditions only the autoscaler sets."""
"""Owned fields the autoscaler writes too, so they are merged into the stored lists
(`Assessment.merge_lists`) instead of being sent whole from the handled event's copy."""

_PATCHED_FIELDS = {name for name, info in InferenceTuningStatus.model_fields.items()
                   if info.alias in OWNED and info.alias not in SHARED}


@dataclass(frozen=True)
class Assessment:
    status: InferenceTuningStatus
    notices: list[Notice] = field(default_factory=list)
    retry_after: float | None = None
    """Set when the operator should look again (the target is missing)."""
    current_replicas: int | None = None
    """The target's replicas, when it is found and autoscaled."""
    conditions: tuple[Condition, ...] = ()
    """The conditions the controller sets (the others in the list are the autoscaler's)."""
    decision: Decision | None = None
    """The decision record to append, when the assessment is news."""
    autoscaling_gone: bool = False
    """The assessed spec has no spec.autoscaling: `merge_lists` removes what the autoscaler
    wrote (its conditions, status.autoscaling and status.batching) if the newest body has
    none either. Nothing
    else would ever update them, and a block left from then would take the replicas someone
    set meanwhile for a revert once autoscaling is back."""
    applied: AppliedSpec | None = None
    """The valid spec assessed, for status.appliedSpec (`merge_lists` writes it)."""

    def patch(self) -> dict[str, Any]:
        """The status merge patch of the owned fields no one else writes, and the target's
        replicas as status.autoscaling.currentReplicas (only that field of the autoscaler's
        block). The shared lists are merged by `merge_lists`."""
        dumped = self.status.model_dump(by_alias=True, mode="json", exclude_none=True,
                                        include=_PATCHED_FIELDS)
        patch = {k: dumped.get(k) for k in OWNED if k not in SHARED}  # set by assess
        if self.current_replicas is not None:
            patch["autoscaling"] = {"currentReplicas": self.current_replicas}
        return patch

    def merge_lists(self, body: dict[str, Any]) -> None:
        """Put the controller's conditions and decision into `body`'s status lists, in place,
        keeping every entry the autoscaler wrote.

        The handler gives this to kopf as a patch function (`kopf.Patch.fns`): kopf applies it
        to the newest body it has (the answer to its merge patch of `patch()`, sent just
        before), sends the difference as a JSON patch that holds only while the tuning is still
        at that body's resourceVersion, and if another write came first applies it again, on
        the next watch event, to the newer body. A list built from the handled event's copy
        would have dropped an autoscaler condition or decision written since."""
        status = body.setdefault("status", {})
        own = [c.model_dump(by_alias=True, mode="json", exclude_none=True)
               for c in self.conditions]
        stored = status.get("conditions") or []
        kept = stored
        if self.autoscaling_gone and not (body.get("spec") or {}).get("autoscaling"):
            # Checked on the newest body: one that has spec.autoscaling again keeps them.
            kept = [c for c in stored
                    if not isinstance(c, dict) or c.get("type") not in AUTOSCALER_CONDITIONS]
            status.pop("autoscaling", None)
            # The autoscaler's too, and nothing updates it without autoscaling: its applied
            # value came back at once when batching Auto did, re-creating every pod with
            # it without an Event or a decision.
            status.pop("batching", None)
        merged = merge_condition_dicts(kept, *own)
        if merged is not None or len(kept) != len(stored):
            status["conditions"] = kept if merged is None else merged
        if self.applied is not None:
            ours = self.applied.model_dump(by_alias=True, mode="json")
            held = status.get("appliedSpec")
            older = not isinstance(held, dict) or not isinstance(held.get("generation"), int) \
                or held["generation"] <= self.applied.generation
            # Whole, not merged: a field removed from the spec goes from this copy too.
            if older and held != ours:
                status["appliedSpec"] = ours
        if self.decision is not None:
            record = self.decision.model_dump(by_alias=True, mode="json", exclude_none=True)
            decisions = status.get("decisions") or []
            last = next((d for d in reversed(decisions)
                         if isinstance(d, dict) and d.get("feature") == record["feature"]),
                        None)
            # Another writer said it since this assessment read the status (both operators of
            # a rolling upgrade handle a Deployment's deletion; the resume handler and the
            # watch on Deployments at start): the same record twice.
            if last is None or last.get("action") != record["action"]:
                status["decisions"] = [*decisions, record][-MAX_DECISIONS:]

    def said_in(self, status: Mapping[str, Any]) -> bool:
        """Whether `status` already says what this assessment's Ready says (status, reason,
        generation): then its Event was posted by whoever wrote it."""
        ours = next((c for c in self.conditions if c.type == ConditionType.READY.value), None)
        stored = next((c for c in status.get("conditions") or ()
                       if isinstance(c, dict) and c.get("type") == ConditionType.READY.value),
                      None)
        return ours is not None and stored is not None and (
            stored.get("status"), stored.get("reason"), stored.get("observedGeneration")) == (
            ours.status.value, ours.reason, ours.observed_generation)


def _not_evaluated(before: InferenceTuningStatus, reason: str, why: str, generation: int,
                   now: str) -> tuple[Condition, ...]:
    """ScalingActive, MetricsAvailable and ScalingLimited while the autoscaler evaluates
    nothing (the target is gone, the spec invalid), where it reported before: it writes
    nothing then, and they went on saying Scaling, Found and TooManyReplicas. Its next
    evaluation sets them again."""
    if find(before.conditions, ConditionType.SCALING_ACTIVE) is None:
        return ()
    return (make_condition(ConditionType.SCALING_ACTIVE, ConditionStatus.FALSE, reason,
                           f"autoscaling evaluates nothing while {why}; replicas are not "
                           "written", generation, now),
            make_condition(ConditionType.METRICS_AVAILABLE, ConditionStatus.UNKNOWN,
                           NOT_EVALUATED, f"not read while {why}", generation, now),
            make_condition(ConditionType.SCALING_LIMITED, ConditionStatus.UNKNOWN,
                           NOT_EVALUATED, f"nothing is decided while {why}", generation,
                           now))


def previous_status(raw: Any) -> InferenceTuningStatus:
    """The status as last written; an unreadable one starts afresh. A block this release
    cannot read (one a newer operator added, or a field it added to one; kept after a
    rollback) is left out rather than making the whole status unreadable: starting afresh
    re-posted the Ready Event at every assessment, and wrote the Deployment's replicas over
    the autoscaler's own count."""
    if not isinstance(raw, dict):
        raw = {}
    try:
        return InferenceTuningStatus.model_validate(raw)
    except ValidationError as exc:
        unreadable = {str(error["loc"][0]) for error in exc.errors() if error["loc"]}
    try:
        status = InferenceTuningStatus.model_validate(
            {key: value for key, value in raw.items() if key not in unreadable})
    except ValidationError:
        return InferenceTuningStatus()
    autoscaling = raw.get("autoscaling")
    evaluated = autoscaling.get("evaluated") if isinstance(autoscaling, dict) else None
    if "autoscaling" in unreadable and isinstance(evaluated, str):
        # Still the autoscaler's: the replicas there are its count, not to be written over
        # with the Deployment's (a scale event it did not record would be lost).
        status = status.model_copy(update={"autoscaling": AutoscalingStatus(
            evaluated=evaluated)})
    return status


def _summary(spec: InferenceTuningSpec) -> str:
    parts = [f"numa {spec.numa.policy.value}", f"allocator {spec.allocator.type.value}"]
    if spec.mig is not None and mig_off():
        # Accepted (its pod tuning goes on), and said where users look first.
        parts.append("MIG not acted on: this operator runs without MIG partitioning "
                     "(--no-mig, the chart's mig.enabled=false); remove spec.mig, or turn "
                     "MIG on")
    elif spec.mig is not None:
        parts.append(f"MIG {spec.mig.profile or 'sized from the model'}")
    if spec.autoscaling is not None and spec.autoscaling.enabled:
        parts.append(f"autoscaling {spec.autoscaling.min_replicas}.."
                     f"{spec.autoscaling.max_replicas}")
    if batching_unused(spec):
        # Accepted, and read by nothing: a platform team took batching for tuned.
        parts.append(f"batching {spec.batching.mode.value} {BATCHING_UNUSED}")
    if spec.canary is not None and spec.canary.enabled:
        # Accepted and checked, but nothing acts on it yet: say so where users look first.
        parts.append(f"canary in {len(spec.canary.steps)} steps ({CANARY_NOT_ENFORCED})")
    return ", ".join(parts)


def _with_decision(status: InferenceTuningStatus, decision: Decision) -> list[Decision]:
    return [*status.decisions, decision][-MAX_DECISIONS:]


def assess(body: dict[str, Any], target: TargetState | None, now: str) -> Assessment:
    """The status and Events for an InferenceTuning `body` whose target is `target`."""
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    before = previous_status(body.get("status"))
    tuning, problems = validate_stored(body)
    if tuning is None:
        fallback = applied_spec(before.applied_spec, generation,
                                str((body.get("metadata") or {}).get("uid") or ""))
        meanwhile = ("new pods are admitted untuned (no earlier generation of the spec was "
                     "valid)" if fallback is None else
                     f"new pods are tuned as generation {fallback[0]} of the spec said "
                     "(status.appliedSpec)")
        invalid = make_condition(
            ConditionType.READY, ConditionStatus.FALSE, "InvalidSpec",
            f"the spec is not acted on until it is fixed: {problems}. Meanwhile {meanwhile}",
            generation, now)
        conditions = set_condition(list(before.conditions), invalid)
        idle = _not_evaluated(before, "InvalidSpec", "the spec is invalid (see Ready)",
                              generation, now)
        for condition in idle:
            conditions = set_condition(conditions, condition)
        was = find(before.conditions, ConditionType.READY)
        said = (was is not None and was.observed_generation == generation
                and was.status is ConditionStatus.FALSE and was.reason == "InvalidSpec")
        # As for every other reason, said once per generation: it was posted again at each
        # re-assessment (every restart, twice per deletion of the target Deployment).
        return Assessment(_status(before, conditions, generation, None),
                          [] if said else [Notice("Warning", "InvalidSpec", problems)],
                          conditions=_owned(conditions, [invalid.type, *(c.type for c in idle)]))

    spec = tuning.spec
    own: tuple[Condition, ...] = (*_target_conditions(spec, target, generation, now),
                                  _mode_condition(spec, generation, now))
    if target is None and spec.autoscaling is not None:
        own += _not_evaluated(before, TARGET_NOT_FOUND, f"Deployment "
                              f"{spec.target_ref.name} is not found", generation, now)
    conditions = list(before.conditions)
    for condition in own:
        conditions = set_condition(conditions, condition)
    # The target's replicas in status.autoscaling.currentReplicas until the autoscaler has
    # evaluated: from then on the count there is its own, which it refreshes every interval
    # and reads back after a restart to find a replicas write it made and did not record
    # (autoscaling._lost_scale_event). Written here over it at each resume (before the new
    # process's first evaluation), it was the count that write had set, and the write's
    # scale event was lost. (A process that dies between the replicas and the status write
    # of the tuning's very first evaluation still loses it: nothing else holds the count.)
    evaluated = before.autoscaling is not None and before.autoscaling.evaluated is not None
    shown = target if spec.autoscaling is not None and not evaluated else None
    status = _status(before, conditions, generation, shown)
    news = _ready_news(before, status, generation, spec, now)
    notices, decision = ([], None) if news is None else ([news[0]], news[1])
    held = before.batching
    if spec.autoscaling is None and held is not None and held.applied is not None:
        # merge_lists drops status.batching with the autoscaler's other blocks: the pods'
        # revision changes with it, and re-tuning replaces them; said, as every change of
        # the applied value is.
        notices.append(Notice("Normal", "BatchingApplied", (
            f"spec.autoscaling was removed, so batching mode Auto no longer sets "
            f"--{held.knob} {held.applied}: re-tuning replaces the pods with the pod "
            "template's value")))
    if decision is not None:
        status = status.model_copy(update={"decisions": _with_decision(status, decision)})
    applied = AppliedSpec(generation=generation, spec=dict(body.get("spec") or {}))
    return Assessment(status, notices, RETRY_TARGET_SECONDS if target is None else None,
                      None if shown is None else shown.replicas,
                      _owned(conditions, [c.type for c in own]), decision,
                      spec.autoscaling is None, applied if generation > 0 else None)


def _target_conditions(spec: InferenceTuningSpec, target: TargetState | None, generation: int,
                       now: str) -> tuple[Condition, Condition]:
    """TargetFound and Ready, from whether the Deployment (and spec.container in it) exists."""
    if target is None:
        message = (f"Deployment {spec.target_ref.name} not found in this namespace; create it "
                   "or fix spec.targetRef.name. Looking again every "
                   f"{RETRY_TARGET_SECONDS:.0f}s")
        return (make_condition(ConditionType.TARGET_FOUND, ConditionStatus.FALSE,
                               "DeploymentNotFound", message, generation, now),
                make_condition(ConditionType.READY, ConditionStatus.FALSE, TARGET_NOT_FOUND,
                               message, generation, now))
    # No ready count: the condition is written when the tuning changes, not when the pods
    # do, and "0/3 ready" stayed there while all three served.
    found = make_condition(
        ConditionType.TARGET_FOUND, ConditionStatus.TRUE, "DeploymentFound",
        f"Deployment {target.name} found", generation, now)
    if spec.container is not None and spec.container not in target.containers:
        return found, make_condition(
            ConditionType.READY, ConditionStatus.FALSE, CONTAINER_NOT_FOUND,
            f"spec.container {spec.container!r} is not in Deployment {target.name}; its "
            f"containers: {', '.join(target.containers)}", generation, now)
    return found, make_condition(
        ConditionType.READY, ConditionStatus.TRUE, ACCEPTED,
        f"spec accepted for Deployment {target.name}: {_summary(spec)}", generation, now)


def _mode_condition(spec: InferenceTuningSpec, generation: int, now: str) -> Condition:
    dry_run = spec.mode is Mode.DRY_RUN
    return make_condition(
        ConditionType.DRY_RUN, ConditionStatus.TRUE if dry_run else ConditionStatus.FALSE,
        "DryRunMode" if dry_run else "Enforcing",
        "decisions are computed and reported; nothing is changed" if dry_run
        else "decisions are applied, except where a condition says what stops them "
        "(ScalingActive for replicas, status.tuning for pods)", generation, now)


def _ready_news(before: InferenceTuningStatus, status: InferenceTuningStatus, generation: int,
                spec: InferenceTuningSpec, now: str) -> tuple[Notice, Decision] | None:
    """The Event and the decision record for a new generation or a Ready that changed, else
    None."""
    ready = find(status.conditions, ConditionType.READY)
    assert ready is not None
    was = find(before.conditions, ConditionType.READY)
    # The Ready condition's own generation, not status.observedGeneration: kopf writes that
    # in a patch of its own, which may land while the conditions' is lost (the process
    # stopped between them), and the new generation then got no Event nor decision.
    if (was is not None and was.observed_generation == generation
            and was.status == ready.status and was.reason == ready.reason):
        return None
    # The condition may say more (a Deployment with many containers lists them all); the
    # Event and the decision record hold a shortened copy.
    notice = Notice("Normal" if ready.status is ConditionStatus.TRUE else "Warning",
                    ready.reason, _clipped(ready.message, MAX_EVENT_MESSAGE))
    return notice, Decision(time=now, feature="controller",
                            action=f"generation {generation}: {ready.reason}",
                            reason=_clipped(ready.message, MAX_DECISION_REASON),
                            # Nothing is applied for a Ready that is not True (the target
                            # not found, its container missing): it read as done.
                            applied=spec.mode is not Mode.DRY_RUN
                            and ready.status is ConditionStatus.TRUE)


def _clipped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _owned(conditions: list[Condition], types: list[str]) -> tuple[Condition, ...]:
    return tuple(c for c in conditions if c.type in types)




def _status(before: InferenceTuningStatus, conditions: list[Condition], generation: int,
            target: TargetState | None) -> InferenceTuningStatus:
    autoscaling = before.autoscaling
    if target is not None:
        autoscaling = (autoscaling or AutoscalingStatus()).model_copy(
            update={"current_replicas": target.replicas})
    return before.model_copy(update={
        "observed_generation": generation,
        "conditions": conditions,
        "phase": phase_of(conditions),
        "autoscaling": autoscaling,
    })
