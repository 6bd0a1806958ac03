"""What one autoscaling evaluation writes, as a pure function: the replicas to write, the status
patch (conditions, `status.autoscaling`, `status.batching`, decisions) and the Event.

The shell (autoscaling.py) reads the scale subresource, calls `plan_evaluation`, writes the
replicas and then this patch (built again by `status_over` if another writer changed the status
meanwhile). The patch is built as plain dicts in the shape of the models in
api/status.py (tests validate each one against its model): it is built for every tuning in every
cycle, and validating and dumping models there cost more than the decision itself.

The patch is a JSON merge patch, so a field that no longer has a value is sent as None, which
removes it; leaving it out would keep the old value (a p99 from before an outage, or a
metricsMissingSince from the last one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from infertune.api.scaling import BatchingMode
from infertune.api.spec import InferenceTuningSpec, Mode
from infertune.api.status import MAX_DECISIONS, ConditionStatus, ConditionType
from infertune.api.units import format_duration
from infertune.controller.conditions import (
    MAX_EVENT_MESSAGE,
    condition_dict,
    merge_condition_dicts,
    stored_reason,
)
from infertune.scaling.batching import MIN_STEP, recommend_batching
from infertune.scaling.engine import ScaleAction, ScaleDecision, decide_scale
from infertune.scaling.signals import TargetSignals, seconds
from infertune.scaling.state import ScalingState, format_time, stored_time
from infertune.tuning.pod_patch import planned_mig, tuning_revision

APPLY_STEP = MIN_STEP
"""Batching mode Auto follows the recommendation only when it moves by this fraction (or
reaches a bound): every change re-creates the pods."""
NOTHING_TUNES_BATCHING = (
    "; spec.batching.mode is Off, so nothing acts on it: set it to Recommend (a batch size in "
    "status.batching) or Auto (applied), or latency.action to ScaleOut to add replicas instead")
"""Said after a TuneBatching decision that no batching mode acts on (the default spec)."""
EVENT_REASONS = {ScaleAction.SCALE_OUT: "ScaledOut", ScaleAction.SCALE_IN: "ScaledIn",
                 ScaleAction.FALLBACK: "ScaledToFallback",
                 ScaleAction.TUNE_BATCHING: "TuneBatching"}


class Blocked(NamedTuple):
    """Why replicas are not written although the spec says Enforce (a condition reason and its
    message)."""

    reason: str
    message: str


class Evaluation(NamedTuple):
    decision: ScaleDecision
    write: int | None
    """Replicas to write through the scale subresource; None writes nothing."""
    status: dict[str, Any]
    """The status merge patch over the status it was planned from, to apply once the replicas
    are written (`status_over` builds it again over a newer status)."""
    event: tuple[str, str] | None
    """(reason, message) of the Event to post, if the evaluation is news."""
    conditions: tuple[dict[str, Any], ...] = ()
    """MetricsAvailable and ScalingActive as they are now."""
    record: dict[str, Any] | None = None
    """The decision record to append to status.decisions, if the evaluation is news."""


def status_over(evaluation: Evaluation, stored: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluation's status patch over `stored`: its own blocks as planned, and the shared
    lists (conditions, decisions) built from what `stored` holds, so that a status another
    writer changed after the plan keeps their entries."""
    own = {k: v for k, v in evaluation.status.items() if k not in ("conditions", "decisions")}
    return {**own, **_shared_lists(stored, evaluation.conditions, evaluation.record)}


def _shared_lists(stored: Mapping[str, Any], conditions: tuple[dict[str, Any], ...],
                  record: dict[str, Any] | None) -> dict[str, Any]:
    """`conditions` merged into the stored list and `record` appended to the stored decisions,
    each only when it changes the list."""
    lists: dict[str, Any] = {}
    merged = merge_condition_dicts(stored.get("conditions") or [], *conditions)
    if merged is not None:
        lists["conditions"] = merged
    if record is not None:
        lists["decisions"] = [*(stored.get("decisions") or []), record][-MAX_DECISIONS:]
    return lists


def plan_evaluation(spec: InferenceTuningSpec, generation: int, status: Mapping[str, Any],
                    signals: TargetSignals, current: int, blocked: Blocked | None,
                    now: float, fight: Mapping[str, Any] | None = None,
                    written: int | None = None, ready: int | None = None) -> Evaluation:
    """Decide from the state stored in `status`, and say what to write and report. `fight` is
    the replica fight to store (fights.Fight.to_json), None when there is none; `written`
    the replicas the operator wrote before that still stand; `ready` the Deployment's
    status.readyReplicas, None when not known."""
    assert spec.autoscaling is not None
    previous: Mapping[str, Any] = status.get("autoscaling") or {}
    decision = decide_scale(spec.autoscaling, current, signals,
                            ScalingState.from_json(previous.get("state")), now, ready)
    if decision.action is ScaleAction.TUNE_BATCHING and spec.batching.mode is BatchingMode.OFF:
        decision = decision._replace(reason=decision.reason + NOTHING_TUNES_BATCHING)
    stamp = format_time(now)
    changes = decision.desired_replicas != current
    applied = changes and spec.mode is Mode.ENFORCE and blocked is None
    patch: dict[str, Any] = {
        "autoscaling": _autoscaling_block(
            decision, decision.state if applied else decision.held_state, stamp,
            stamp if applied else previous.get("lastScaleTime"), fight),
    }
    kept = decision.desired_replicas if applied else written
    patch["autoscaling"]["writtenReplicas"] = kept
    patch["autoscaling"]["writtenTarget"] = None if kept is None else spec.target_ref.name
    own = _conditions(spec, generation, decision, blocked, stamp)
    news = _news(spec, status, decision, changes, applied, stamp,
                 stored_reason(status, ConditionType.SCALING_ACTIVE) == own[1]["reason"])
    record, event = news if news is not None else (None, None)
    patch.update(_shared_lists(status, own, record))
    batching = _batching_block(spec, status, decision, now)
    if batching is not None:
        patch["batching"] = batching
    return Evaluation(decision, decision.desired_replicas if applied else None, patch, event,
                      own, record)


def _conditions(spec: InferenceTuningSpec, generation: int, decision: ScaleDecision,
                blocked: Blocked | None, stamp: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """MetricsAvailable and ScalingActive as they are now; merged into the stored list, they
    leave it out of the patch when both already say so.

    Their messages are stable while nothing changes: the reason of each decision, with its
    numbers, is in status.autoscaling.reason, so conditions change (and are written) only when
    the situation does, as conditions are meant to.
    """
    problems = "; ".join(decision.signals.problems)
    metrics = condition_dict(ConditionType.METRICS_AVAILABLE,
                             ConditionStatus.FALSE if problems else ConditionStatus.TRUE,
                             "MetricsMissing" if problems else "Found",
                             problems or "queue and latency series found", generation, stamp)
    if spec.autoscaling is not None and not spec.autoscaling.enabled:
        scaling = condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.FALSE,
                                 "Disabled", "spec.autoscaling.enabled is false: the signals are "
                                 "read and reported, replicas are neither decided nor "
                                 "written; set it to true to resume", generation, stamp)
    elif blocked is not None:
        scaling = condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.FALSE,
                                 blocked.reason, blocked.message, generation, stamp)
    elif spec.mode is Mode.DRY_RUN:
        scaling = condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.TRUE, "DryRun",
                                 "mode DryRun: decisions are computed and reported in "
                                 "status.autoscaling, replicas are not written", generation,
                                 stamp)
    else:
        scaling = condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.TRUE, "Scaling",
                                 f"scaling Deployment {spec.target_ref.name}; the last decision "
                                 "and its reason are in status.autoscaling", generation, stamp)
    return metrics, scaling


def _autoscaling_block(decision: ScaleDecision, state: ScalingState, stamp: str,
                       last_scale: str | None,
                       fight: Mapping[str, Any] | None) -> dict[str, Any]:
    """`status.autoscaling` (api.status.AutoscalingStatus); None fields are removed."""
    reading = decision.signals
    latency, queue = reading.latency_s, reading.queue_per_replica
    stored = state.to_json()
    return {
        "currentReplicas": decision.current_replicas,
        "desiredReplicas": decision.desired_replicas,
        "p99Ms": None if latency is None else round(latency * 1000, 1),
        "p99": None if latency is None else format_duration(latency),
        "queueDepth": None if queue is None else round(queue, 2),
        "lastScaleTime": last_scale,
        "breaches": reading.breaches,
        "reason": decision.reason,
        "action": decision.action.value,
        "latencyKind": reading.latency_kind,
        "evaluated": stamp,
        "state": stored,
        "replicaFight": fight,
    }


def _news(spec: InferenceTuningSpec, status: Mapping[str, Any], decision: ScaleDecision,
          changes: bool, applied: bool, stamp: str,
          same_situation: bool = True) -> tuple[dict[str, Any], tuple[str, str]] | None:
    """The decision record and the Event ((reason, message)) for a scale action (or would-be
    action), if any. `same_situation`: ScalingActive gives the reason it gave before (why
    replicas are not written: DryRun, an HPA, a refused write)."""
    previous: Mapping[str, Any] = status.get("autoscaling") or {}
    previous_action = previous.get("action")
    batching_news = (decision.action is ScaleAction.TUNE_BATCHING
                     and previous_action != ScaleAction.TUNE_BATCHING.value)
    if not changes and not batching_news:
        return None
    previous_applied = previous.get("lastScaleTime") == previous.get("evaluated")
    if changes and not applied and not previous_applied and same_situation and (
            previous_action, previous.get("currentReplicas"),
            previous.get("desiredReplicas")) == (
            decision.action.value, decision.current_replicas, decision.desired_replicas):
        # The same would-be change as the last evaluation, which was not written either
        # (DryRun, or blocked): said once, not every interval, where it pushed the other
        # features out of status.decisions.
        return None
    prefix = "" if applied or not changes else (
        "dry run, not applied: " if spec.mode is Mode.DRY_RUN else "not applied: ")
    record = {"time": stamp, "feature": "autoscaling",
              "action": f"{decision.action.value} {decision.current_replicas} -> "
                        f"{decision.desired_replicas}",
              "reason": decision.reason[:1000], "applied": applied}
    return record, (EVENT_REASONS.get(decision.action, "Scaled"),
                    (prefix + decision.reason)[:MAX_EVENT_MESSAGE])


def _batching_block(spec: InferenceTuningSpec, status: Mapping[str, Any],
                    decision: ScaleDecision, now: float) -> dict[str, Any] | None:
    """`status.batching` (api.status.BatchingStatus), or None when batching is Off.

    In mode Auto each step starts from the value applied, and the next step waits until the
    pods run that value and the latency has been measured on them (`_serving`): a step every
    interval while pods are still being re-created would take the knob to its bound on the
    strength of latency the last step could not have changed yet."""
    assert spec.autoscaling is not None
    if spec.batching.mode is BatchingMode.OFF:
        return None
    stored: Mapping[str, Any] = status.get("batching") or {}
    auto = spec.batching.mode is BatchingMode.AUTO and spec.mode is not Mode.DRY_RUN
    in_effect = _within(spec, stored.get("applied")) if auto else None
    rec = recommend_batching(spec.batching, spec.engine, spec.autoscaling, decision.signals,
                             in_effect)
    if rec is None:
        return None
    recommended, reason, since = rec.recommended, rec.reason, None
    if in_effect is not None:
        since, waiting = _serving(spec, status, in_effect, now)
        if waiting is not None and rec.changed:
            recommended = in_effect
            reason = (f"{rec.knob.value} stays at {in_effect} until its effect is measured: "
                      f"{waiting}. The latency and queue now say: {rec.reason}")
    applied = _applied_knob(spec, in_effect, recommended)
    if applied != in_effect:
        since = None  # new pods: their latency is measured from when they all run it
    block = {"knob": rec.knob.value, "current": rec.current, "recommended": recommended,
             "applied": applied, "servingSince": since, "reason": reason}
    # `applied` unknown is left out, not removed: an applied value outside mode Auto (or in
    # DryRun) stays as it was, and the webhook reads it only in mode Auto. The others are sent
    # as they are (None removes a stale one).
    if applied is None:
        del block["applied"]
    return block


def _within(spec: InferenceTuningSpec, value: Any) -> int | None:
    """The stored applied value inside the spec's bounds, as the webhook sets it on pods
    (the bounds may have changed since it was applied)."""
    if value is None:
        return None
    return min(max(int(value), spec.batching.min), spec.batching.max)


def _serving(spec: InferenceTuningSpec, status: Mapping[str, Any], value: int,
             now: float) -> tuple[str | None, str | None]:
    """(servingSince, why the next step waits, or None): since when every pod has run the
    applied `value` (status.tuning, as re-tuning counts them), and whether the latency
    samples the rule reads have all been measured since, over the metrics window."""
    assert spec.autoscaling is not None
    tuning: Mapping[str, Any] = status.get("tuning") or {}
    revision = tuning_revision(spec, value, planned_mig(status.get("mig") or {}))
    outdated, tuned = int(tuning.get("outdatedPods") or 0), int(tuning.get("tunedPods") or 0)
    if tuning.get("revision") != revision or outdated or not tuned:
        counted = (f"{outdated} of {outdated + tuned} pods still run another tuning"
                   if tuning.get("revision") == revision else "re-tuning has not counted the "
                   "pods at this value yet")
        return None, f"waiting for the pods to run it ({counted}; see status.tuning)"
    since = stored_time((status.get("batching") or {}).get("servingSince"))
    if since is None or since > now:  # a clock that stepped back starts the wait again
        since = now
    settle = (seconds(spec.metrics.window)
              + spec.autoscaling.interval.seconds * spec.autoscaling.latency.consecutive_samples)
    if now - since < settle:
        return format_time(since), (
            f"every pod runs it since {format_time(since)}; the latency reflects it from "
            f"{format_time(since + settle)} (the {spec.metrics.window} metrics window and "
            f"{spec.autoscaling.latency.consecutive_samples} samples)")
    return format_time(since), None


def _applied_knob(spec: InferenceTuningSpec, previous: int | None,
                  recommended: int) -> int | None:
    if spec.batching.mode is not BatchingMode.AUTO or spec.mode is Mode.DRY_RUN:
        return None
    bounds = (spec.batching.min, spec.batching.max)
    if (previous is None or abs(recommended - previous) >= APPLY_STEP * previous
            or (recommended in bounds and recommended != previous)):
        return recommended
    return previous
