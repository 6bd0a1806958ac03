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

from infertune.api.scaling import (
    STARTING_S,
    BatchingKnob,
    BatchingMode,
    LatencyAction,
    MetricsUnavailableAction,
    SelectPolicy,
)
from infertune.api.spec import (
    Engine,
    InferenceTuningSpec,
    Mode,
    auto_batching_problem,
    batching_knob,
)
from infertune.api.status import MAX_DECISIONS, ConditionStatus, ConditionType
from infertune.controller.conditions import (
    MAX_EVENT_MESSAGE,
    condition_dict,
    merge_condition_dicts,
    stored_condition,
    stored_reason,
)
from infertune.scaling.batching import MIN_STEP, REQUEST_KNOBS, recommend_batching
from infertune.scaling.behavior import Limit, rule_text
from infertune.scaling.engine import (
    Outage,
    ScaleAction,
    ScaleDecision,
    decide_scale,
    with_reason,
)
from infertune.scaling.reading import FLOOR_PROBLEM, Reading
from infertune.scaling.signals import FLOAT_NOISE, TargetSignals, latency_text, seconds
from infertune.scaling.state import ScalingState, Serving, format_time, stored_time
from infertune.tuning.pod_patch import TemplateBatching, planned_mig, tuning_revision

APPLY_STEP = MIN_STEP
"""Batching mode Auto follows the recommendation only when it moves by this fraction (or
reaches a bound): every change re-creates the pods."""
NOTHING_TUNES_BATCHING = (
    "; spec.batching.mode is Off, so nothing acts on it: set it to Recommend (a batch size in "
    "status.batching) or Auto (applied), or latency.action to Auto or ScaleOut to add replicas "
    "instead")
"""Said after a TuneBatching decision (latency.action TuneBatching) that no batching mode acts
on."""
FLAG_IGNORED = "BatchingFlagIgnored"
"""Warning Event and decision record when mode Auto finds that the pods run past the value
it applied (status.batching.ignored)."""
SCALED_OUT, SCALED_IN = "ScaledOut", "ScaledIn"
EVENT_REASONS = {ScaleAction.SCALE_OUT: SCALED_OUT, ScaleAction.SCALE_IN: SCALED_IN,
                 ScaleAction.FALLBACK: "ScaledToFallback",
                 ScaleAction.TUNE_BATCHING: "TuneBatching"}


_TUNE_BATCHING = str(ScaleAction.TUNE_BATCHING)
SCALE_WRITE_REFUSED = "ScaleWriteRefused"
"""ScalingActive reason and Warning Event when the API server refuses the replicas write."""
SCALE_WRITE_FAILED = "ScaleWriteFailed"
"""ScalingActive reason and Warning Event when the replicas write met a server error (5xx)
and was not there when read again: it may still land."""
WRITE_FAILURES = (SCALE_WRITE_REFUSED, SCALE_WRITE_FAILED)
"""Blocks the replicas write itself met: said by the evaluation that wrote (a Warning with
its decision record), and kept in ScalingActive until a write lands (`stored_write_failure`)."""
SEVERAL_TUNINGS = "SeveralTunings"
HPA_PRESENT = "HorizontalPodAutoscalerPresent"
WRITERS_BLOCK = (SEVERAL_TUNINGS, HPA_PRESENT)
"""The blocks (fights.blocked_by) that other writers of the Deployment make, whatever this
tuning does: a DryRun trial's ScalingActive names them (their messages are stable)."""


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
    """MetricsAvailable, ScalingActive and ScalingLimited as they are now."""
    record: dict[str, Any] | None = None
    """The decision record to append to status.decisions, if the evaluation is news."""
    batching_news: tuple[dict[str, Any], tuple[str, str]] | None = None
    """(decision record, (reason, message) of the Event) when mode Auto changes the applied
    batching value (each change re-creates the pods, so it is recorded as a scale is), or
    finds that the pods ignore it (FLAG_IGNORED, a Warning: `batching_event_type`)."""
    blocked_news: tuple[str, str] | None = None
    """(reason, message) of a Warning Event when replicas stop being written (a fight, an
    HPA, another tuning): said once, when ScalingActive turns to it, even on a Hold."""


def batching_event_type(reason: str) -> str:
    """The type of the Event of an Evaluation's batching_news."""
    return "Warning" if reason == FLAG_IGNORED else "Normal"


def status_over(evaluation: Evaluation, stored: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluation's status patch over `stored`: its own blocks as planned, and the shared
    lists (conditions, decisions) built from what `stored` holds, so that a status another
    writer changed after the plan keeps their entries."""
    own = {k: v for k, v in evaluation.status.items() if k not in ("conditions", "decisions")}
    batching = None if evaluation.batching_news is None else evaluation.batching_news[0]
    return {**own, **_shared_lists(stored, evaluation.conditions, evaluation.record, batching)}


def _shared_lists(stored: Mapping[str, Any], conditions: tuple[dict[str, Any], ...],
                  *records: dict[str, Any] | None) -> dict[str, Any]:
    """`conditions` merged into the stored list and `records` appended to the stored
    decisions, each only when it changes the list."""
    lists: dict[str, Any] = {}
    merged = merge_condition_dicts(stored.get("conditions") or [], *conditions)
    if merged is not None:
        lists["conditions"] = merged
    new = [r for r in records if r is not None]
    if new:
        lists["decisions"] = appended_decisions(stored, *new)
    return lists


def appended_decisions(stored: Mapping[str, Any], *records: dict[str, Any]) -> list[Any]:
    """status.decisions as stored with `records` appended, the newest MAX_DECISIONS kept."""
    return [*(stored.get("decisions") or []), *records][-MAX_DECISIONS:]


def plan_evaluation(spec: InferenceTuningSpec, generation: int, status: Mapping[str, Any],
                    signals: TargetSignals, current: int, blocked: Blocked | None,
                    now: float, fight: Mapping[str, Any] | None = None,
                    written: int | None = None, ready: int | None = None,
                    template: TemplateBatching | None = None,
                    unprobed: str | None = None,
                    pods_gone_by: float | None = None,
                    ready_since: float | None = None) -> Evaluation:
    """Decide from the state stored in `status`, and say what to write and report. `fight` is
    the replica fight to store (fights.Fight.to_json), None when there is none; `written`
    the replicas the operator wrote before that still stand; `ready` the Deployment's
    status.readyReplicas, None when not known; `template` the batching knob as the
    Deployment's pod template has it (pod_patch.template_batching), None when not read;
    `unprobed` the serving container when it has no readiness or startup probe
    (pod_patch.unprobed_container): its pods' Ready then says only that they started;
    `pods_gone_by` when the last pod of the target seen terminating is gone at the latest
    (None when not known): the running requests are read for batching's `_ignored` only
    from after it; `ready_since` when the last of the `ready` pods became Ready, None when
    not known (engine.decide_scale). It is not used for an `unprobed` container (Ready says
    only that its pods started), nor when it is not after the last evaluation, which read
    fewer of them Ready: a node clock behind the operator's put it there (or the
    Deployment's count lagged its pods), and the join is then counted from now."""
    assert spec.autoscaling is not None
    previous: Mapping[str, Any] = status.get("autoscaling") or {}
    # The state of another Deployment (spec.targetRef changed) is not this one's; a status
    # from before `target` was stored is taken as this one's.
    own_state = previous.get("target") in (None, spec.target_ref.name)
    state = ScalingState.from_json(previous.get("state") if own_state else None)
    if ready_since is not None:  # read only then: every tuning passes here every interval
        last = stored_time(previous.get("evaluated"))
        if last is not None and ready_since <= last:
            ready_since = None
    kubelet_ready = None
    if unprobed is not None and ready is not None:
        # Serving is counted from the pods that report; a Ready pod that stops reporting
        # (its scrape times out under load) still counts at the target on a scale-in.
        kubelet_ready, ready = ready, reporting_ready(ready, signals, now, state.serving)
        ready_since = None
    ignored = _ignored(spec, status, template, signals, now, current, ready, pods_gone_by)

    def stuck(reading: Reading) -> tuple[str, str] | None:
        return _batching_stuck(spec, status, template, now, signals.fresh_at(now), current,
                               ready, reading, ignored.record)

    def auto_stuck(reading: Reading) -> str | None:
        # Asked by the engine for a breach latency.action Auto would hand to batching: with
        # batching Off (the default) it was handed to nothing, a queue at 0 (vLLM's, while
        # its batch takes every request) took the replicas away, and the latency stayed
        # above its target for good; the breach scales out instead (_latency_proposal).
        got = stuck(reading)
        return None if got is None else got[0]

    decision = decide_scale(spec.autoscaling, current, signals, state, now, ready,
                            kubelet_ready, auto_stuck,
                            batch_changed_at(spec, status, now, signals.fresh_at(now), current,
                                             ready), ready_since)
    told = None
    if (decision.action is ScaleAction.TUNE_BATCHING
            and spec.autoscaling.latency.action is LatencyAction.TUNE_BATCHING
            and (told := stuck(decision.signals)) is not None):
        decision = with_reason(decision, decision.reason + told[1])
    batching = _batching_block(spec, status, decision, now, ready, template,
                               signals.fresh_at(now), ignored)
    if (decision.action is ScaleAction.TUNE_BATCHING and batching is not None
            and spec.batching.mode is BatchingMode.RECOMMEND and told is None):
        # Said where the breach is: "tune batching" read as if something did, while the
        # value to set was only in status.batching. Not the value the pods run already
        # (the queue above target or missing, where the batch is not what is short): that
        # told them to set what they had.
        in_use = batching.get("current")
        decision = with_reason(decision, (
            f"{decision.reason}; the batching recommendation keeps --{batching['knob']}="
            f"{in_use} (status.batching.reason says why), so nothing acts on this breach: "
            "set latency.action to Auto to add replicas for it"
            if in_use is not None and batching["recommended"] == in_use else
            f"{decision.reason}; mode Recommend applies nothing: "
            f"{_how_to_apply(spec, batching)}"))
    stamp = format_time(now)
    changes = decision.desired_replicas != current
    applied = changes and spec.mode is Mode.ENFORCE and blocked is None
    patch: dict[str, Any] = {
        "autoscaling": _autoscaling_block(
            decision, decision.state if applied else decision.held_state, stamp,
            # Only the target's own: after spec.targetRef changed, the old one's time read as
            # a scale of a Deployment never scaled.
            stamp if applied else previous.get("lastScaleTime") if own_state else None, fight,
            None if spec.autoscaling is None else seconds(spec.autoscaling.latency.target)),
    }
    if changes and blocked is not None and spec.mode is Mode.ENFORCE:
        # As the Event says it: the reason ended "4 -> 6" while nothing was written.
        patch["autoscaling"]["reason"] = (f"not applied ({blocked.reason}: see "
                                          f"ScalingActive): {decision.reason}")
    kept = decision.desired_replicas if applied else written
    patch["autoscaling"]["target"] = spec.target_ref.name
    patch["autoscaling"]["writtenReplicas"] = kept
    patch["autoscaling"]["writtenTarget"] = None if kept is None else spec.target_ref.name
    own = _conditions(spec, generation, decision, blocked, stamp, unprobed)
    was_scaling = stored_reason(status, ConditionType.SCALING_ACTIVE)
    news = _news(spec, status, decision, changes, applied, stamp,
                 was_scaling == own[1]["reason"], blocked)
    record, event = news if news is not None else (None, None)
    batching_news = None
    if batching is not None:
        patch["batching"] = batching
        batching_news = _batching_news(status, batching, stamp)
    elif spec.batching.mode is BatchingMode.OFF and status.get("batching"):
        # Off: what Auto applied is forgotten, as in Recommend; kept, it came back with Auto
        # at once, re-creating the pods with it without an Event or a decision.
        patch["batching"] = None
    patch.update(_shared_lists(status, own, record,
                               None if batching_news is None else batching_news[0]))
    blocked_news = None
    # Said when ScalingActive turns to the block, as written now: with autoscaling disabled
    # it says Disabled, and the block (an HPA) was announced again at every evaluation.
    if (blocked is not None and blocked.reason not in WRITE_FAILURES
            and own[1]["reason"] == blocked.reason
            and was_scaling != blocked.reason):
        blocked_news = (blocked.reason, blocked.message[:MAX_EVENT_MESSAGE])
    return Evaluation(decision, decision.desired_replicas if applied else None, patch, event,
                      own, record, batching_news, blocked_news)


FAILED_KEPT_S = 600.0
"""How long Holds keep reporting a replicas write that met a server error
(SCALE_WRITE_FAILED): it passes, and one 503 said ScalingActive=False for as long as the
decision held, a day later still."""


def stored_write_failure(status: Mapping[str, Any]) -> Blocked | None:
    """The refused or failed replicas write ScalingActive reports in `status`, if it does: a
    Hold after it keeps reporting it (the last write did not land) until a write lands, so
    that the next refusal is not news again (a server error FAILED_KEPT_S at most)."""
    condition = stored_condition(status, ConditionType.SCALING_ACTIVE) or {}
    reason, message = condition.get("reason"), condition.get("message")
    if reason in WRITE_FAILURES and isinstance(message, str):
        return Blocked(str(reason), message)
    return None


def reporting_ready(ready: int, signals: TargetSignals, now: float,
                    serving: Serving | None = None) -> int:
    """The ready count of pods whose serving container has no readiness or startup probe:
    Ready says only that they started (an engine loads its model for minutes after that), so
    the pods that report the queue now stand in for it, at most `ready` of them. Without
    queue data nothing new is known: the replicas known to serve (`serving`, stored) stand
    in, at most `ready` of them, so that a count short of the replicas still counts every one
    after STARTING_S (a breach is not held for as long as the queue is missing); before any
    is known, `ready` itself."""
    queue = signals.queue
    if queue.latest(signals.fresh_at(now)) is None or queue.pods is None:
        return ready if serving is None else min(ready, serving.replicas)
    return min(ready, queue.pods)


def _conditions(spec: InferenceTuningSpec, generation: int, decision: ScaleDecision,
                blocked: Blocked | None, stamp: str,
                unprobed: str | None = None) -> tuple[dict[str, Any], ...]:
    """MetricsAvailable, ScalingActive and ScalingLimited as they are now; merged into the
    stored list, they leave it out of the patch when all already say so.

    Their messages are stable while nothing changes: the reason of each decision, with its
    numbers, is in status.autoscaling.reason, so conditions change (and are written) only when
    the situation does, as conditions are meant to.
    """
    problems = "; ".join(decision.signals.problems)
    resolution = all(p.startswith(FLOOR_PROBLEM) for p in decision.signals.problems)
    said = problems or "queue and latency series found"
    if decision.signals.warnings:
        # Status as the data says (Prometheus answered); the data may lack what it warns of.
        said += ("; Prometheus warned with its answer: "
                 + "; ".join(decision.signals.warnings))
    metrics = condition_dict(ConditionType.METRICS_AVAILABLE,
                             ConditionStatus.FALSE if problems else ConditionStatus.TRUE,
                             ("LatencyTargetBelowResolution" if resolution else
                              "MetricsMissing") if problems else "Found",
                             said, generation, stamp)
    if spec.autoscaling is not None and not spec.autoscaling.enabled:
        scaling = condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.FALSE,
                                 "Disabled", "spec.autoscaling.enabled is false: the signals are "
                                 "read and reported, replicas are neither decided nor "
                                 "written; set it to true to resume", generation, stamp)
    elif spec.mode is Mode.DRY_RUN:
        # Before the blocks: a trial writes nothing, so an HPA or the tuning that scales the
        # Deployment stops nothing of it (the documented way to try the operator beside
        # them). It was False with a Warning to remove the HPA before the trial showed
        # anything; what Enforce would meet is said instead.
        would = ("" if blocked is None or blocked.reason not in WRITERS_BLOCK else
                 f"; in Enforce, replicas would not be written now: {blocked.message}")
        scaling = condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.TRUE, "DryRun",
                                 "mode DryRun: decisions are computed and reported in "
                                 "status.autoscaling, replicas are not written"
                                 + would + _unprobed_note(unprobed), generation, stamp)
    elif blocked is not None:
        scaling = condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.FALSE,
                                 blocked.reason, blocked.message, generation, stamp)
    elif decision.current_replicas == 0:
        # As HPA (ScalingDisabled): it said Scaling beside a reason saying it was paused.
        scaling = condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.FALSE,
                                 SCALED_TO_ZERO, f"Deployment {spec.target_ref.name} has 0 "
                                 "replicas: it is left at 0 until someone scales it up, as an "
                                 "HPA leaves it", generation, stamp)
    elif decision.outage is not None:
        # As HPA's FailedGetExternalMetric: True "Scaling" read as if the signals were
        # driving replicas while nothing was read.
        scaling = _outage_condition(spec, decision.outage, generation, stamp)
    else:
        scaling = condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.TRUE, "Scaling",
                                 f"scaling Deployment {spec.target_ref.name}; the last decision "
                                 "and its reason are in status.autoscaling"
                                 + _unprobed_note(unprobed), generation, stamp)
    return metrics, scaling, _limited_condition(spec, decision, generation, stamp)


SCALED_TO_ZERO = "ScaledToZero"
"""ScalingActive's reason, and a Warning Event's when it turns to it, while the Deployment
has 0 replicas (left alone until someone scales it up, as an HPA leaves it)."""

METRICS_UNAVAILABLE = "MetricsUnavailable"
"""ScalingActive's reason while no signal has usable data and replicas are held."""


def _outage_condition(spec: InferenceTuningSpec, outage: Outage, generation: int,
                      stamp: str) -> dict[str, Any]:
    """ScalingActive while no signal has usable data (ScaleDecision.outage): its message says
    what happens to the replicas, without the time it has lasted (that is in
    status.autoscaling.reason), so that it is written once per outage."""
    assert spec.autoscaling is not None
    rule = spec.autoscaling.metrics_unavailable
    if outage is Outage.FALLBACK:
        said = (f"no usable metrics for {rule.after} or longer (see MetricsAvailable): "
                f"spec.autoscaling.metricsUnavailable.fallbackReplicas "
                f"({rule.fallback_replicas}) is in effect")
        if spec.autoscaling.scale_up.select_policy is SelectPolicy.DISABLED:
            said += (", but scaleUp.selectPolicy is Disabled, so no replicas are added; none "
                     "are removed")
        else:
            said += (": fewer replicas are raised to it within the scale-up rate limits, and "
                     "none are removed")
        return condition_dict(ConditionType.SCALING_ACTIVE, ConditionStatus.TRUE, "Fallback",
                              f"{said}, until the signals are back", generation, stamp)
    later = ("" if rule.action is not MetricsUnavailableAction.FALLBACK
             or rule.fallback_replicas is None else
             f"; after {rule.after} without them, they are raised to fallbackReplicas "
             f"({rule.fallback_replicas})")
    return condition_dict(
        ConditionType.SCALING_ACTIVE, ConditionStatus.FALSE, METRICS_UNAVAILABLE,
        "no usable metrics (see MetricsAvailable): replicas are held at their count, never "
        f"scaled in on missing data{later}", generation, stamp)


def _limited_condition(spec: InferenceTuningSpec, decision: ScaleDecision, generation: int,
                       stamp: str) -> dict[str, Any]:
    """ScalingLimited as HPA sets it: True when maxReplicas, minReplicas or a rate limit kept
    the replicas from what the signals called for (ScaleDecision.limited), Unknown when
    nothing was decided from them (a fallback in effect included: ScalingActive says so).
    Its messages name the setting, not the numbers of the cycle (those are in
    status.autoscaling.reason)."""
    assert spec.autoscaling is not None
    scaling = spec.autoscaling
    if decision.wanted is None or decision.outage is not None:
        return condition_dict(ConditionType.SCALING_LIMITED, ConditionStatus.UNKNOWN,
                              "NotDecided", "replicas are not decided from the signals now "
                              "(see ScalingActive)", generation, stamp)
    limited = decision.limited
    if limited is None:
        return condition_dict(
            ConditionType.SCALING_LIMITED, ConditionStatus.FALSE, "DesiredWithinRange",
            "the replicas the signals call for are within minReplicas..maxReplicas "
            f"({scaling.min_replicas}..{scaling.max_replicas}) and the rate limits",
            generation, stamp)
    if limited is Limit.TOO_MANY:
        message = (f"the signals call for more replicas than maxReplicas "
                   f"({scaling.max_replicas}); raise spec.autoscaling.maxReplicas if the "
                   "Deployment may have more (the numbers are in status.autoscaling.reason)")
        knob = batching_knob(spec.batching, spec.engine)
        if (scaling.latency.action is LatencyAction.AUTO
                and spec.batching.mode is BatchingMode.OFF
                and auto_batching_problem(spec.batching, knob, spec.engine) is None):
            # Replicas are the lever left only because batching is off, and mode Auto could
            # drive this knob within these bounds (not Triton's, TGI's, nor a token knob
            # bounded by request counts: _batching_stuck scales those out in Auto too).
            message += ("; where that reason says the latency comes from batching, "
                        "spec.batching.mode Auto lowers the batch instead of adding replicas")
    elif limited is Limit.TOO_FEW:
        message = (f"the signals call for fewer replicas than minReplicas "
                   f"({scaling.min_replicas}), which are kept")
    else:
        up = limited is Limit.SCALE_UP
        rules, field = ((scaling.scale_up, "scaleUp") if up else (scaling.scale_down, "scaleDown"))
        if rules.select_policy is SelectPolicy.DISABLED:
            message = (f"{'scale-up' if up else 'scale-down'} is disabled by "
                       f"spec.autoscaling.{field}.selectPolicy Disabled: no replicas are "
                       f"{'added' if up else 'removed'}, whatever the signals call for (the "
                       "numbers are in status.autoscaling.reason)")
        else:
            message = (f"{'scale-up' if up else 'scale-down'} limited by "
                       f"spec.autoscaling.{field} ({rule_text(rules, '+' if up else '-')}): "
                       "the replicas move toward what the signals call for in steps (the "
                       "numbers are in status.autoscaling.reason)")
    return condition_dict(ConditionType.SCALING_LIMITED, ConditionStatus.TRUE, str(limited),
                          message, generation, stamp)


def _unprobed_note(container: str | None) -> str:
    if container is None:
        return ""
    return (f"; container {container} has no readinessProbe or startupProbe, so its pods are "
            "Ready as soon as they start: a replica counts as serving once it reports the "
            "queue metric instead; add a readinessProbe on the engine's health endpoint")


def _autoscaling_block(decision: ScaleDecision, state: ScalingState, stamp: str,
                       last_scale: str | None, fight: Mapping[str, Any] | None,
                       target_s: float | None = None) -> dict[str, Any]:
    """`status.autoscaling` (api.status.AutoscalingStatus); None fields are removed."""
    reading = decision.signals
    latency, queue = reading.latency_s, reading.queue_per_replica
    stored = state.to_json()
    return {
        "currentReplicas": decision.current_replicas,
        "desiredReplicas": decision.desired_replicas,
        "p99Ms": None if latency is None else round(latency * 1000, 1),
        # As the reasons write it: whole milliseconds showed "75ms" for a breach of 75ms,
        # and "0s" for 0.4ms.
        "p99": None if latency is None else (
            latency_text(latency, target_s) if reading.latency_floor_s is None
            # Under the lowest bucket the quantile is a fraction of it, not the latency.
            else f"<={latency_text(reading.latency_floor_s)}"),
        "queueDepth": None if queue is None else round(queue, 2),
        "lastScaleTime": last_scale,
        "breaches": reading.breaches,
        "reason": decision.reason,
        "action": str(decision.action),
        "latencyKind": reading.latency_kind,
        "evaluated": stamp,
        "state": stored,
        "replicaFight": fight,
    }


def _news(spec: InferenceTuningSpec, status: Mapping[str, Any], decision: ScaleDecision,
          changes: bool, applied: bool, stamp: str, same_situation: bool = True,
          blocked: Blocked | None = None) -> tuple[dict[str, Any], tuple[str, str]] | None:
    """The decision record and the Event ((reason, message)) for a scale action (or would-be
    action), if any. `same_situation`: ScalingActive gives the reason it gave before (why
    replicas are not written: DryRun, an HPA, a refused write)."""
    previous: Mapping[str, Any] = status.get("autoscaling") or {}
    previous_action = previous.get("action")
    batching_news = (decision.action is ScaleAction.TUNE_BATCHING
                     and previous_action != _TUNE_BATCHING)
    if not changes and not batching_news:
        return None
    previous_applied = previous.get("lastScaleTime") == previous.get("evaluated")
    if changes and not applied and not previous_applied and same_situation and (
            previous_action, previous.get("currentReplicas"),
            previous.get("desiredReplicas")) == (
            str(decision.action), decision.current_replicas, decision.desired_replicas):
        # The same would-be change as the last evaluation, which was not written either
        # (DryRun, or blocked): said once, not every interval, where it pushed the other
        # features out of status.decisions.
        return None
    prefix = "" if applied or not changes else (
        "dry run, not applied: " if spec.mode is Mode.DRY_RUN else
        # Why, first: the Event said only "not applied", never the fight or the HPA.
        f"not applied ({blocked.reason}: see ScalingActive): " if blocked is not None else
        "not applied: ")
    record = {"time": stamp, "feature": "autoscaling",
              "action": f"{decision.action} {decision.current_replicas} -> "
                        f"{decision.desired_replicas}",
              "reason": decision.reason[:1000], "applied": applied}
    return record, (EVENT_REASONS.get(decision.action, "Scaled"),
                    (prefix + decision.reason)[:MAX_EVENT_MESSAGE])


def _how_to_apply(spec: InferenceTuningSpec, batching: Mapping[str, Any]) -> str:
    """How a recommended value of mode Recommend is applied, for the breach's reason: on the
    pod template's command line, but Triton's queue delay in the model config (tritonserver
    has no such option and refuses to start on it); mode Auto only where it can apply it."""
    value = batching["recommended"]
    knob = batching_knob(spec.batching, spec.engine)
    # A step down from `max`, where the value in use is not known (Triton's queue delay is 0
    # by default): set where the pods run more, or it raises what it is to lower.
    unknown = (" where the value in use is above it (it is not known here: this is a step "
               "down from spec.batching.max)" if batching.get("current") is None else "")
    if knob is BatchingKnob.MAX_QUEUE_DELAY_MICROSECONDS:
        return (f"set dynamic_batching.max_queue_delay_microseconds: {value} in the model "
                f"config (status.batching.recommended){unknown}")
    where = (f"set --{batching['knob']}={value} on the pod template "
             f"(status.batching.recommended){unknown}")
    if (problem := auto_batching_problem(spec.batching, knob, spec.engine)) is not None:
        return f"{where}; mode Auto would not apply it: {problem}"
    return f"{where}, or spec.batching.mode to Auto"


def _batching_block(spec: InferenceTuningSpec, status: Mapping[str, Any],
                    decision: ScaleDecision, now: float, ready: int | None = None,
                    template: TemplateBatching | None = None,
                    read_at: float | None = None,
                    ignored: Ignored | None = None) -> dict[str, Any] | None:
    """`status.batching` (api.status.BatchingStatus), or None when batching is Off.

    Each step starts from the value in use: in mode Auto the value applied (for this knob),
    else the value on the pod template's command line (within min..max) when it is there.
    Mode Auto changes the value only when the latency and queue call for it, and never so
    that the pods get a value they already run or one on the other side of what was called
    for; each change re-creates the pods. It changes nothing while: the knob or the template
    cannot carry it (`auto_batching_problem`, a shell script, no command line); replicas are
    being added (re-creating pods then takes capacity away when it is needed);
    autoscaling.enabled is false.

    After a change, the next step waits until the pods run that value and the latency has
    been measured on them (`_serving`): a step every interval while pods are still being
    re-created would take the knob to its bound on the strength of latency the last step
    could not have changed yet."""
    assert spec.autoscaling is not None
    knob = batching_knob(spec.batching, spec.engine)
    if spec.batching.mode is BatchingMode.OFF or knob is None:
        return None
    stored: Mapping[str, Any] = status.get("batching") or {}
    auto, in_effect = _applied_in_effect(spec, stored, knob.value)
    on_pods = None if template is None else template.value
    seen, retried = NOT_IGNORED if ignored is None else ignored
    problem = _auto_problem(spec, knob, template, seen)
    if problem is not None:
        # The webhook does not set the value applied before (TGI's token budget since it is
        # known to be ignored, a template turned into a shell script): the pods run the
        # template's, and the step starts from it. The applied value stays in status, so
        # that the pods' revision does not change and they are not re-created for nothing.
        in_effect = None
    start: int | None = in_effect
    if in_effect is not None:
        origin = "applied"
    else:
        start, origin = template_start(spec, template)
    rec = recommend_batching(spec.batching, spec.engine, spec.autoscaling, decision.signals,
                             start, origin)
    if rec is None:
        return None
    recommended, reason, since, ready_since = rec.recommended, rec.reason, None, None
    if auto and problem is not None:
        # As mode Recommend: a value the webhook cannot set (or must not) would re-create the
        # pods at every step, and they would still run the old one.
        block = {"knob": rec.knob.value, "current": rec.current, "recommended": recommended,
                 "servingSince": None, "readySince": None,
                 "reason": f"mode Auto cannot apply it, so it is only recommended: {problem}. "
                           f"{reason}", "ignored": seen}
        if stored.get("knob") not in (None, knob.value):
            block["applied"] = None  # another knob's: it would come back as this one's
        return block
    if in_effect is not None:
        since, ready_since, waiting = _serving(spec, status, in_effect, now,
                                               now if read_at is None else read_at,
                                               decision.current_replicas, ready)
        if waiting is not None and (rec.changed or _above_target(spec, decision.signals)):
            recommended = in_effect
            reason = (f"{rec.knob.value} stays at {in_effect} until its effect is measured: "
                      f"{waiting}. The latency and queue now say: {rec.reason}")
    if auto and rec.direction != 0 and _adding_replicas(decision):
        recommended = in_effect if in_effect is not None else recommended
        reason = (f"{rec.knob.value} is not changed while replicas are added (re-creating "
                  f"the pods now would take capacity away when it is needed): {rec.reason}")
        applied = in_effect
    elif auto and in_effect is None and on_pods is None and rec.from_max:
        # Nothing known of the setting in use (no flag on the template, no running gauge):
        # a "lower" from max may raise the engine's default (a token budget of a few
        # thousand would become 32768), so nothing is applied; the reason says what to set.
        applied = None
        reason = (f"{reason}; not applied: the value the pods run is not known, set "
                  f"--{rec.knob.value} on the pod template to start from it")
    elif auto:
        breached = _breached(stored, knob.value, now)
        if rec.direction > 0 and breached is not None and recommended >= breached[0]:
            # Back up to a value that breached the latency: the knob went back and forth
            # (20, 16, 20, 16), each move a rollout.
            recommended = max(breached[0] - 1, in_effect or 0, spec.batching.min)
            reason = (f"{reason}; kept under {breached[0]}, which breached the latency "
                      f"target, until {format_time(breached[1])}")
        applied = _applied_knob(spec, in_effect, recommended, rec.direction, on_pods)
    else:
        applied = None
    if (auto and applied != in_effect) or retried:
        since = ready_since = None  # new pods: measured from when they all run it
    block = {"knob": rec.knob.value, "current": rec.current, "recommended": recommended,
             "applied": applied, "servingSince": since, "readySince": ready_since,
             "reason": reason, "ignored": seen}
    if auto:
        # From the value the pods ran, else the one the step started from (the peak of the
        # requests running per replica): left out, a lower made from the peak was not
        # remembered, and raises went back past it within minutes.
        before = next((v for v in (in_effect, on_pods) if v is not None),
                      None if rec.from_max else rec.base)
        block.update(_breach_memory(stored, knob.value, before, applied, rec.direction, now))
    # `applied` unknown is left out, not removed: an applied value in DryRun or with
    # autoscaling disabled stays as it was, and the webhook reads it only in mode Auto. One
    # applied for another knob is removed: it would come back as this knob's. The others
    # are sent as they are (None removes a stale one).
    if applied is None and stored.get("knob") in (None, knob.value):
        del block["applied"]
    if spec.batching.mode is BatchingMode.RECOMMEND and stored.get("applied") is not None:
        # The pods no longer run it (the webhook sets it in mode Auto only, so leaving Auto
        # re-created them without it): kept, it came back when Auto did, and the pods were
        # re-created with an old value without an Event or a decision.
        block["applied"] = None
    if auto and applied is not None and applied != in_effect:
        block["appliedSince"] = format_time(now)
    elif block.get("applied", True) is None:
        block["appliedSince"] = None
    return block


def _auto_problem(spec: InferenceTuningSpec, knob: BatchingKnob,
                  template: TemplateBatching | None,
                  ignored: Mapping[str, Any] | None = None) -> str | None:
    """Why mode Auto cannot set `knob` on the pods (the knob and its bounds, then the pod
    template: a shell script, no command line; then the pods seen to ignore it, `_ignored`),
    None when it can."""
    problem = auto_batching_problem(spec.batching, knob, spec.engine)
    if problem is None and template is not None:
        problem = template.problem
    if problem is None and ignored is not None:
        problem = ignored_problem(ignored)
    return problem


def ignored_problem(ignored: Mapping[str, Any]) -> str:
    """What status.batching.ignored means, and what to do."""
    knob, value = ignored.get("knob"), ignored.get("value")
    return (f"the pods ran {ignored.get('peak')} requests at once per engine with "
            f"--{knob}={value} set, which allows at most {value}, so the engine does not read "
            "the flag from the container's arguments (an entrypoint script that drops "
            "them?) and each change would only re-create the pods; have the entrypoint pass "
            "its arguments on (mode Auto tries again once the container's image, command, "
            "args or environment change on the pod template, or after leaving mode Auto and "
            "coming back), or set the value in the engine's configuration and use mode "
            "Recommend")


class Ignored(NamedTuple):
    """status.batching.ignored after a reading (`_ignored`)."""

    record: dict[str, Any] | None
    """The record, None when there is none (which removes a stored one)."""
    retried: bool = False
    """A stored record was dropped because the container changed: the wait for a value's
    effect starts again (servingSince), so that the next record is read only from pods of
    the new container (the last old ones finish their requests after the rollout)."""


NOT_IGNORED = Ignored(None)


def _ignored(spec: InferenceTuningSpec, status: Mapping[str, Any],
             template: TemplateBatching | None, signals: TargetSignals, now: float,
             replicas: int, ready: int | None, pods_gone_by: float | None) -> Ignored:
    """status.batching.ignored after these signals, in mode Auto (None otherwise, which
    removes it), for `_batching_block` and `_batching_stuck` alike: the one stored while the
    serving container's image, command, args and environment are those it was seen with (or
    are not known: not read, or the Deployment rolls out), else a new one when every replica
    runs the value applied for a knob counted in requests (re-tuning counts each at it), on
    the current container, for as long as the next step waits (`_serving`), and the running
    requests per engine went above it in the queue's sustain window, which lies in that
    time (the span of the running query) and after every pod seen terminating was gone
    (`pods_gone_by`, when known: re-tuning does not count those, and an old pod finishing
    its requests after a rollout weighs in the mean until then). Only with the engine's own
    running gauge, read per engine process: a name or template of the user's may count a
    pod's data-parallel ranks together. vLLM and SGLang never run more requests at once
    than `max-num-seqs` and `max-running-requests` allow, nor TGI more than
    `max-concurrent-requests`: an engine started by a script that drops its arguments ran
    its own default, and Auto walked the knob down to `min`, re-creating every pod at each
    step while the latency did not move."""
    if spec.batching.mode is not BatchingMode.AUTO:
        return NOT_IGNORED  # the usual case: first, and nothing else read
    knob = batching_knob(spec.batching, spec.engine)
    if knob is None:
        return NOT_IGNORED
    stored: Mapping[str, Any] = status.get("batching") or {}
    held = stored.get("ignored")
    container = None if template is None else template.container
    if isinstance(held, Mapping) and held.get("knob") == knob.value:
        seen_with = held.get("container")
        if container is None or seen_with is None or seen_with == container:
            return Ignored(dict(held))
        return Ignored(None, True)  # the container changed: it may pass the flag on now
    auto, in_effect = _applied_in_effect(spec, stored, knob.value)
    running, read_at = signals.running, signals.fresh_at(now)
    peak = running.peak if running.available else None  # as Reading.running_peak
    drained = pods_gone_by is None or running.end - running.span > pods_gone_by
    # Every replica counted at the value: a pod re-tuning leaves out (opted out of the
    # webhook) runs the engine's default, and weighs in the mean all the same.
    counted = int((status.get("tuning") or {}).get("tunedPods") or 0) >= replicas
    own_gauge = spec.metrics.running is None and (
        spec.metrics.queries is None or spec.metrics.queries.running is None)
    if (not auto or in_effect is None or container is None or knob not in REQUEST_KNOBS
            or not drained or not own_gauge or not counted or spec.engine is Engine.CUSTOM
            or peak is None or peak <= in_effect + FLOAT_NOISE
            or _serving(spec, status, in_effect, now, read_at, replicas, ready)[2] is not None):
        return NOT_IGNORED
    return Ignored({"knob": knob.value, "value": in_effect, "peak": round(peak, 1),
                    "since": format_time(now), "container": container})


def _applied_in_effect(spec: InferenceTuningSpec, stored: Mapping[str, Any],
                       knob: str) -> tuple[bool, int | None]:
    """(whether batching mode Auto applies values now, the value it applied for `knob` that
    the pods run, within min..max; None when none)."""
    assert spec.autoscaling is not None
    # The webhook sets the applied value in mode Auto whether or not autoscaling is enabled:
    # with it disabled the steps started from the pod template's value, and a "lower" from
    # 128 to 64 there raised the 32 the pods ran.
    sets = spec.batching.mode is BatchingMode.AUTO and spec.mode is not Mode.DRY_RUN
    # A value applied for another knob (the knob or the engine changed) says nothing of this
    # one: 64 requests are not 64 tokens.
    return sets and spec.autoscaling.enabled, (
        _within(spec, stored.get("applied")) if sets and stored.get("knob") == knob else None)


def _batching_stuck(spec: InferenceTuningSpec, status: Mapping[str, Any],
                    template: TemplateBatching | None, now: float, read_at: float,
                    replicas: int, ready: int | None,
                    reading: Reading | None = None,
                    ignored: Mapping[str, Any] | None = None) -> tuple[str, str] | None:
    """Why the batch is not lowered for a breach that TuneBatching hands to it, None when it
    is (mode Recommend recommends it): (the words for latency.action Auto, which scales out
    instead, and the note for TuneBatching, which leaves the breach to nothing). Mode Auto
    lowers nothing where `_batching_block` only recommends: a knob or a template it cannot
    set, or a value in use it does not know."""
    if spec.batching.mode is BatchingMode.OFF:
        return "spec.batching.mode is Off, so nothing lowers the batch", NOTHING_TUNES_BATCHING
    knob = batching_knob(spec.batching, spec.engine)
    if knob is None:
        return (f"engine {spec.engine} has no batching knob, so nothing lowers the batch",
                f"; engine {spec.engine} has no batching knob, so nothing acts on it: set "
                "spec.batching.knob, or latency.action to Auto or ScaleOut to add replicas "
                "instead")
    if spec.batching.mode is BatchingMode.AUTO:
        problem = _auto_problem(spec, knob, template, ignored)
        stored: Mapping[str, Any] = status.get("batching") or {}
        on_pods = None if template is None else template.value
        applied = (_within(spec, stored.get("applied")) if stored.get("knob") == knob.value
                   else None)
        if problem is None and on_pods is None and applied is None and not (
                knob in REQUEST_KNOBS and reading is not None
                and reading.running_peak is not None):
            problem = (f"the value of {knob.value} the pods run is not known; set "
                       f"--{knob.value} on the pod template")
        if problem is not None:
            return (f"batching mode Auto cannot lower {knob.value} (status.batching says why), "
                    "so nothing lowers the batch",
                    f"; batching mode Auto cannot lower {knob.value} ({problem}), so nothing "
                    "acts on it: set latency.action to Auto or ScaleOut to add replicas instead")
        since = stored_time(stored.get("appliedSince"))
        if (applied is not None and since is not None and now - since >= STARTING_S
                and (counted := _not_on_pods(spec, status, applied)) is not None):
            # A value the pods do not take up (re-tuning never evicts the only Ready pod; a
            # PodDisruptionBudget that allows no eviction): the breach waited on it for
            # hours, with ScalingActive saying Scaling. Not for longer than a pod takes to
            # load its model.
            said = (f"batching mode Auto set {knob.value} {applied} at {format_time(since)} "
                    f"and the pods do not run it yet ({counted}: see status.tuning)")
            return (f"{said}, so nothing lowers the batch",
                    f"; {said}, so nothing acts on it: set latency.action to Auto or ScaleOut "
                    "to add replicas instead")
    floor = _batching_floor(spec, status, template, now, read_at, replicas, ready)
    if floor is None:
        return None
    return (f"batching is at its minimum {floor}",
            f"; batching is at its minimum {floor} (spec.batching.min), so nothing acts on it: "
            "set latency.action to Auto or ScaleOut to add replicas instead")


def _batching_floor(spec: InferenceTuningSpec, status: Mapping[str, Any],
                    template: TemplateBatching | None, now: float, read_at: float,
                    replicas: int, ready: int | None) -> int | None:
    """The batching value in use (as `_batching_block` starts its step from it) when it is
    already spec.batching.min, so a breach the batch causes cannot lower it; None when it is
    not, or not known (the recommender then starts from the running requests or max), or
    when mode Auto lowered it there for a breach less than STARTING_S ago and its effect is
    not measured yet (`_serving`): the latency is still the old value's, and a scale-out on
    it came on top of the pods' re-creation. Not for longer: a re-creation that cannot end (a
    PodDisruptionBudget that allows no eviction, pods the webhook refuses) held the breach
    with nothing acting on it."""
    knob = batching_knob(spec.batching, spec.engine)
    if spec.batching.mode is BatchingMode.OFF or knob is None:
        return None
    stored: Mapping[str, Any] = status.get("batching") or {}
    _, in_effect = _applied_in_effect(spec, stored, knob.value)
    start = in_effect if in_effect is not None else template_start(spec, template)[0]
    if start is None or start > spec.batching.min:
        return None
    breach = _breached(stored, knob.value, now)
    lowered_at = None if breach is None else breach[1] - BREACH_MEMORY_S
    if (in_effect is not None and lowered_at is not None and now - lowered_at < STARTING_S
            and _serving(spec, status, in_effect, now, read_at, replicas, ready)[2] is not None):
        return None
    return start


def template_start(spec: InferenceTuningSpec,
                   template: TemplateBatching | None) -> tuple[int | None, str]:
    """(where a batching step starts when nothing is applied: the value on the pod template,
    within min..max; None when not known, and how to say where it came from)."""
    on_pods = None if template is None else template.value
    start = _within(spec, on_pods)
    return start, ("on the pod template" if start == on_pods else f"{on_pods} on the pod "
                   f"template, within {spec.batching.min}..{spec.batching.max}")


BREACH_MEMORY_S = 3600.0
"""How long a value that breached the latency caps the raises after it (status.batching.
breached): a knob going back and forth between two values re-creates the pods each time."""


def _breached(stored: Mapping[str, Any], knob: str, now: float) -> tuple[int, float] | None:
    """(the lowest value the latency breached at, until when it caps raises), while it
    does, for `knob`."""
    value, until = stored.get("breached"), stored_time(stored.get("breachedUntil"))
    if value is None or until is None or until <= now or stored.get("knob") != knob:
        return None
    return int(value), until


def _breach_memory(stored: Mapping[str, Any], knob: str, before: int | None,
                   applied: int | None, direction: int, now: float) -> dict[str, Any]:
    """status.batching.breached and breachedUntil: set when mode Auto lowers the knob for a
    breach (from `before`, the value the pods ran), kept while they hold, removed after."""
    held = _breached(stored, knob, now)
    if direction < 0 and before is not None and applied is not None and applied < before:
        value = before if held is None else min(held[0], before)
        return {"breached": value, "breachedUntil": format_time(now + BREACH_MEMORY_S)}
    if held is not None:
        return {"breached": held[0], "breachedUntil": format_time(held[1])}
    return {"breached": None, "breachedUntil": None}


def _adding_replicas(decision: ScaleDecision) -> bool:
    """Whether replicas are being added: this decision adds some, the signals want more than
    the rate limits allow now, or replicas added before are not known to serve yet
    (ScalingState.serving)."""
    if decision.action is ScaleAction.SCALE_OUT:
        return True
    wanted = decision.wanted or 0
    serving = decision.held_state.serving
    return (wanted > decision.current_replicas
            or (serving is not None and serving.replicas < decision.current_replicas))


def _batching_news(status: Mapping[str, Any], block: Mapping[str, Any],
                   stamp: str) -> tuple[dict[str, Any], tuple[str, str]] | None:
    """The decision record and Event when the block changes the applied value: the pods are
    re-created with it, and the reason in status.batching is overwritten at the next
    evaluation."""
    applied = block.get("applied")
    stored: Mapping[str, Any] = status.get("batching") or {}
    ignored = block.get("ignored")
    if ignored is not None and stored.get("ignored") != ignored:
        problem = ignored_problem(ignored)
        record = {"time": stamp, "feature": "batching",
                  "action": f"{ignored['knob']} {ignored['value']} not applied by the pods",
                  "reason": problem[:1000], "applied": False}
        return record, (FLAG_IGNORED, f"batching mode Auto stops changing {ignored['knob']}: "
                        f"{problem}"[:MAX_EVENT_MESSAGE])
    before = stored.get("applied") if stored.get("knob") == block["knob"] else None
    if applied is None or applied == before:
        return None
    change = f"{block['knob']} {'unset' if before is None else before} -> {applied}"
    reason = str(block["reason"])
    record = {"time": stamp, "feature": "batching", "action": change,
              "reason": reason[:1000], "applied": True}
    return record, ("BatchingApplied",
                    f"{change}: new pods get it, and re-tuning replaces the running ones "
                    f"(status.tuning): {reason}"[:MAX_EVENT_MESSAGE])


def _within(spec: InferenceTuningSpec, value: Any) -> int | None:
    """The stored applied value inside the spec's bounds, as the webhook sets it on pods
    (the bounds may have changed since it was applied)."""
    if value is None:
        return None
    return min(max(int(value), spec.batching.min), spec.batching.max)


def _not_on_pods(spec: InferenceTuningSpec, status: Mapping[str, Any],
                 value: int) -> str | None:
    """Why re-tuning does not count every pod at the applied `value` (status.tuning), None
    when it does."""
    tuning: Mapping[str, Any] = status.get("tuning") or {}
    revision = tuning_revision(spec, value, planned_mig(status.get("mig") or {}))
    outdated, tuned = int(tuning.get("outdatedPods") or 0), int(tuning.get("tunedPods") or 0)
    if tuning.get("revision") == revision and not outdated and tuned:
        return None
    return (f"{outdated} of {outdated + tuned} pods still run another tuning"
            if tuning.get("revision") == revision else "re-tuning has not counted the pods "
            "at this value yet")


def _serving(spec: InferenceTuningSpec, status: Mapping[str, Any], value: int,
             now: float, read_at: float, replicas: int | None = None,
             ready: int | None = None) -> tuple[str | None, str | None, str | None]:
    """(servingSince, readySince, why the next step waits, or None). servingSince: since
    when re-tuning counts every pod at the applied `value` (status.tuning). readySince:
    since when every one of the `replicas` has also been Ready (`ready`, when known), which
    the pods counted first may not be yet (loading the model). The step waits until the
    samples the rules read were all measured after that: the latency over the metrics window
    and its samples, the queue over its sustain window, all ending at `read_at` (when the
    signals were read, TargetSignals.fresh_at)."""
    assert spec.autoscaling is not None
    since, ready_since, base, waiting = _serving_from(spec, status, value, now, replicas, ready)
    stamps = (None if since is None else format_time(since),
              None if ready_since is None else format_time(ready_since))
    if base is None:
        return (*stamps, waiting)
    settle = _settle_s(spec)
    if read_at - base < settle:
        return (*stamps,
                f"every pod is Ready since {format_time(base)} with it; the latency and queue "
                f"reflect it from {format_time(base + settle)} (the {spec.metrics.window} "
                f"metrics window and {spec.autoscaling.latency.consecutive_samples} samples, "
                f"the queue's {spec.autoscaling.queue.sustain} sustain)")
    return (*stamps, None)


def _settle_s(spec: InferenceTuningSpec) -> float:
    """How long after every pod serves with a batching value the samples the rules read are
    all measured on it: the latency over the metrics window and its samples, the queue over
    its sustain window."""
    assert spec.autoscaling is not None
    latency_settle = (seconds(spec.metrics.window) + spec.autoscaling.interval.seconds
                      * spec.autoscaling.latency.consecutive_samples)
    return max(latency_settle, seconds(spec.autoscaling.queue.sustain))


def _above_target(spec: InferenceTuningSpec, reading: Reading) -> bool:
    """The latency is above its target (a breach or not yet): while a batching value is not
    measured, its samples are not counted (engine.decide_scale's `batch_changed`), and the
    recommendation says what it waits for."""
    assert spec.autoscaling is not None
    return (reading.latency_s is not None
            and reading.latency_s > seconds(spec.autoscaling.latency.target))


def batch_changed_at(spec: InferenceTuningSpec, status: Mapping[str, Any], now: float,
                     read_at: float, replicas: int, ready: int | None) -> float | None:
    """engine.decide_scale's `batch_changed`: since when every pod serves with the value
    batching mode Auto last set, while its effect is not measured yet (`_serving`), `now`
    while they do not all run it. None when no change of the last STARTING_S is being
    measured: pods that never take the value up (a PodDisruptionBudget that allows no
    eviction) must not keep a breach from counting for longer."""
    knob = batching_knob(spec.batching, spec.engine)
    if spec.batching.mode is not BatchingMode.AUTO or knob is None:
        return None  # the usual case
    stored: Mapping[str, Any] = status.get("batching") or {}
    auto, in_effect = _applied_in_effect(spec, stored, knob.value)
    since = stored_time(stored.get("appliedSince"))
    if not auto or in_effect is None or since is None or not 0 <= now - since < STARTING_S:
        return None
    _, _, base, _ = _serving_from(spec, status, in_effect, now, replicas, ready)
    if base is None:
        return now
    return base if read_at - base < _settle_s(spec) else None


def _serving_from(spec: InferenceTuningSpec, status: Mapping[str, Any], value: int,
                  now: float, replicas: int | None = None, ready: int | None = None,
                  ) -> tuple[float | None, float | None, float | None, str | None]:
    """(servingSince, readySince, since when every pod serves with `value`, why not yet)
    for `_serving`: the third is None, and the fourth says why, while the pods do not all
    run it or are not all Ready with it yet."""
    counted = _not_on_pods(spec, status, value)
    if counted is not None:
        return None, None, None, f"waiting for the pods to run it ({counted}; see status.tuning)"
    stored: Mapping[str, Any] = status.get("batching") or {}
    since = stored_time(stored.get("servingSince"))
    if since is None or since > now:  # a clock that stepped back starts the wait again
        since = now
    ready_since = stored_time(stored.get("readySince"))
    if ready_since is not None and not since <= ready_since <= now:
        ready_since = None  # from another serving period, or a clock that stepped back
    if replicas is not None and ready is not None and ready < replicas and ready_since is None:
        if now - since < STARTING_S:
            # Counted by re-tuning as they are created: the last ones may still load the
            # model. Not for ever: a pod Pending for a GPU that does not come must not hold
            # the knob while the latency breaches (the autoscaler hands such a breach to
            # batching); the settle then counts from when they were counted.
            return since, None, None, (
                f"waiting for the pods to run it ({replicas - ready} of {replicas} not Ready "
                f"yet; at most until {format_time(since + STARTING_S)})")
        base = since
    elif replicas is None or ready is None:
        base = since if ready_since is None else ready_since  # readiness not read
    else:
        # Every replica Ready now: once seen, a pod that restarts later does not start the
        # wait again, as a replica that served stays counted.
        ready_since = now if ready_since is None else ready_since
        base = ready_since
    return since, ready_since, base, None


def _applied_knob(spec: InferenceTuningSpec, previous: int | None, recommended: int,
                  direction: int = 0, on_pods: int | None = None) -> int | None:
    """The value mode Auto applies. A first value (nothing applied for this knob yet) only
    when the latency and queue call for a change (`direction`), and only one on that side of
    the value the pods run (`on_pods`): switching to mode Auto re-created every pod with a
    value derived from the peak of running requests, calling for no change at all; a raise
    from an unknown setting (the engine's default) may lower it; and a value on the template
    outside min..max turned a raise into a lower. Then a move of APPLY_STEP or more, or to a
    bound. Called in mode Auto only (not in DryRun, nor with autoscaling disabled)."""
    if previous is None:
        if on_pods is None:
            return recommended if direction < 0 else None
        if direction * (recommended - on_pods) > 0:
            return recommended
        return None
    bounds = (spec.batching.min, spec.batching.max)
    if (abs(recommended - previous) >= APPLY_STEP * previous
            or (recommended in bounds and recommended != previous)):
        return recommended
    return previous
