"""The controller's status and Events, as a pure function of the object and its target."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from infertune.api.status import ConditionType, Phase
from infertune.controller.conditions import find
from infertune.controller.reconcile import TargetState, assess, previous_status

TARGET = TargetState(name="qwen", replicas=2, containers=("vllm",))


def _body(generation: int = 1, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "infertune.io/v1alpha1", "kind": "InferenceTuning",
        "metadata": {"name": "qwen", "namespace": "ml", "generation": generation,
                     "uid": "u-1", "resourceVersion": "7"},
        "spec": {"targetRef": {"name": "qwen"}, "engine": "vllm", **spec},
        **({"status": status} if status is not None else {}),
    }


def _dump(result: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = result.status.model_dump(by_alias=True, exclude_none=True,
                                                      mode="json")
    return dumped


def test_accepted_spec_is_ready_with_observed_generation() -> None:
    result = assess(_body(generation=3), TARGET, "2026-12-03T10:00:00Z")
    ready = find(result.status.conditions, ConditionType.READY)
    assert ready is not None and ready.status.value == "True" and ready.observed_generation == 3
    assert result.status.observed_generation == 3
    assert result.status.phase is Phase.ACTIVE
    assert [(n.type, n.reason) for n in result.notices] == [("Normal", "Accepted")]
    assert result.retry_after is None


def test_a_canary_section_is_accepted_but_said_to_be_not_enforced() -> None:
    canary = {"steps": [{"weight": 10}, {"weight": 50}]}
    ready = find(assess(_body(canary=canary), TARGET, "2026-12-03T10:00:00Z").status.conditions,
                 ConditionType.READY)
    assert ready is not None and ready.reason == "Accepted"
    assert "canary in 2 steps (not enforced yet" in ready.message
    off = find(assess(_body(canary={**canary, "enabled": False}), TARGET,
                      "2026-12-03T10:00:00Z").status.conditions, ConditionType.READY)
    assert off is not None and "canary" not in off.message


def test_batching_without_autoscaling_is_accepted_but_said_to_be_not_acted_on() -> None:
    ready = find(assess(_body(batching={"mode": "Auto"}), TARGET,
                        "2026-12-03T10:00:00Z").status.conditions, ConditionType.READY)
    assert ready is not None and ready.reason == "Accepted"
    assert "batching Auto not acted on without spec.autoscaling" in ready.message
    scaled = find(assess(_body(batching={"mode": "Auto"}, autoscaling={}), TARGET,
                         "2026-12-03T10:00:00Z").status.conditions, ConditionType.READY)
    assert scaled is not None and "batching" not in scaled.message


def test_dry_run_is_reported_as_its_own_phase_and_condition() -> None:
    result = assess(_body(mode="DryRun"), TARGET, "2026-12-03T10:00:00Z")
    dry = find(result.status.conditions, ConditionType.DRY_RUN)
    assert dry is not None and dry.status.value == "True"
    assert result.status.phase is Phase.DRY_RUN
    assert result.status.decisions[-1].applied is False


def test_missing_target_is_explained_and_retried() -> None:
    result = assess(_body(), None, "2026-12-03T10:00:00Z")
    ready = find(result.status.conditions, ConditionType.READY)
    assert ready is not None and ready.reason == "TargetNotFound"
    assert "fix spec.targetRef.name" in ready.message
    assert result.status.phase is Phase.PENDING
    assert result.notices[0].type == "Warning"
    assert result.retry_after is not None


def test_transition_time_and_events_stay_put_when_nothing_changed() -> None:
    first = assess(_body(), TARGET, "2026-12-03T10:00:00Z")
    second = assess(_body(status=_dump(first)), TARGET, "2026-12-03T10:05:00Z")
    ready = find(second.status.conditions, ConditionType.READY)
    assert ready is not None and ready.last_transition_time == "2026-12-03T10:00:00Z"
    assert second.notices == []
    assert len(second.status.decisions) == 1


def test_a_new_generation_is_a_new_decision() -> None:
    first = assess(_body(), TARGET, "2026-12-03T10:00:00Z")
    second = assess(_body(generation=2, status=_dump(first)), TARGET, "2026-12-03T10:05:00Z")
    assert [d.action for d in second.status.decisions] == ["generation 1: Accepted",
                                                           "generation 2: Accepted"]
    # Announced once: assessed again as stored, nothing new.
    again = assess(_body(generation=2, status=_dump(second)), TARGET, "2026-12-03T10:06:00Z")
    assert again.notices == [] and len(again.status.decisions) == 2


@pytest.mark.parametrize("reason", ["Accepted", "InvalidSpec"])
def test_a_generation_is_announced_though_its_observed_generation_landed_alone(
        reason: str) -> None:
    """kopf writes status.observedGeneration in a patch of its own: when it landed and the
    conditions' patch did not (the process stopped between them), generation 2 got no Event
    nor decision record, as if announced already."""
    invalid = {"autoscaling": {"minReplicas": 9, "maxReplicas": 2}} if reason == "InvalidSpec" \
        else {}
    first = _dump(assess(_body(**invalid), TARGET, "2026-12-03T10:00:00Z"))
    half = {**first, "observedGeneration": 2}
    second = assess(_body(generation=2, status=half, numa={"policy": "none"}, **invalid),
                    TARGET, "2026-12-03T10:05:00Z")
    assert [n.reason for n in second.notices] == [reason]


def test_invalid_spec_is_refused_with_the_field() -> None:
    result = assess(_body(autoscaling={"minReplicas": 9, "maxReplicas": 2}), TARGET,
                    "2026-12-03T10:00:00Z")
    ready = find(result.status.conditions, ConditionType.READY)
    assert ready is not None and ready.reason == "InvalidSpec"
    assert "spec.autoscaling.minReplicas: 9 is above maxReplicas 2" in ready.message
    assert result.status.phase is Phase.ERROR


@pytest.mark.parametrize("spec", [
    {"metrics": {"podLabel": "infertune_target"}}, {"metrics": {"namespaceLabel": "pod"}},
    {"metrics": {"queueDepth": "group:left"}}, {"autoscaling": {"interval": "1.0005s"}}])
def test_a_stored_spec_only_validate_refuses_keeps_its_pod_tuning(spec: dict[str, Any]) -> None:
    """The previous release stored these; refused by the model, they turned the tuning
    InvalidSpec on upgrade, and its pods untuned. `validate` refuses them; the operator
    tunes the pods and reads no data for the autoscaler (its own queries fail)."""
    result = assess(_body(**spec), TARGET, "2026-12-03T10:00:00Z")
    ready = find(result.status.conditions, ConditionType.READY)
    assert ready is not None and (ready.status.value, ready.reason) == ("True", "Accepted")


def test_unknown_container_is_not_ready() -> None:
    result = assess(_body(container="server"), TARGET, "2026-12-03T10:00:00Z")
    ready = find(result.status.conditions, ConditionType.READY)
    assert ready is not None and ready.reason == "ContainerNotFound"


def test_a_long_ready_message_is_shortened_in_the_event_and_the_decision() -> None:
    """ContainerNotFound lists the Deployment's containers: 20 names of 60 characters made a
    decision record longer than its 1024-character limit, and the handler failed on it."""
    names = tuple(f"sidecar-{i:02d}-" + "x" * 50 for i in range(20))
    result = assess(_body(container="server"), replace(TARGET, containers=names),
                    "2026-12-03T10:00:00Z")
    ready = find(result.status.conditions, ConditionType.READY)
    assert ready is not None and ready.reason == "ContainerNotFound"
    assert all(name in ready.message for name in names)  # the condition says it all
    assert result.decision is not None and len(result.decision.reason) == 1024
    assert result.decision.reason.endswith("...")
    assert [len(n.message) for n in result.notices if n.reason == "ContainerNotFound"] == [1000]


def test_replicas_column_is_filled_when_autoscaling_is_configured() -> None:
    result = assess(_body(autoscaling={}), TARGET, "2026-12-03T10:00:00Z")
    assert _dump(result)["autoscaling"]["currentReplicas"] == 2


def test_unreadable_previous_status_starts_afresh() -> None:
    result = assess(_body(status={"phase": "Bogus", "conditions": "nope"}), TARGET,
                    "2026-12-03T10:00:00Z")
    assert result.status.phase is Phase.ACTIVE


def test_the_patch_holds_only_what_the_controller_owns() -> None:
    # Blocks of the autoscaler and the timers, as the handled event carried them: written
    # back, an older copy would undo their newer writes (a scale event, a re-tune).
    status = {"autoscaling": {"desiredReplicas": 5, "currentReplicas": 4, "action": "ScaleOut",
                              "state": {"recommendations": [], "scaleEvents": []}},
              "tuning": {"revision": "r1", "tunedPods": 2, "outdatedPods": 0,
                         "message": "2 pods tuned", "problems": []}}
    result = assess(_body(status=status, autoscaling={"maxReplicas": 8}), TARGET,
                    "2026-12-03T10:00:00Z")
    patch = result.patch()
    # The shared lists are not in it: merge_lists puts them into the stored ones.
    assert set(patch) == {"observedGeneration", "phase", "autoscaling"}
    assert patch["autoscaling"] == {"currentReplicas": TARGET.replicas}
    assert patch["observedGeneration"] == 1 and patch["phase"] == "Active"
    assert {c.type for c in result.conditions} == {"Ready", "TargetFound", "DryRun"}


def test_the_count_of_an_autoscaler_that_has_evaluated_is_left_to_it() -> None:
    """Once the autoscaler has evaluated, currentReplicas is its own: the resume handler
    wrote the Deployment's count over it before the new process's first evaluation, which
    then could not tell the replicas write the old process made just before it died (its
    scale event was lost, and the next pod came inside the rate limit's period)."""
    status = {"autoscaling": {"currentReplicas": 2, "desiredReplicas": 2, "action": "Hold",
                              "evaluated": "2026-12-03T09:59:45Z"}}
    result = assess(_body(status=status, autoscaling={"maxReplicas": 8}),
                    replace(TARGET, replicas=3), "2026-12-03T10:00:00Z")
    assert "autoscaling" not in result.patch()
    assert result.status.autoscaling is not None
    assert result.status.autoscaling.current_replicas == 2


def test_the_patch_leaves_status_autoscaling_alone_without_autoscaling_or_target() -> None:
    status = {"autoscaling": {"desiredReplicas": 5, "currentReplicas": 4}}
    assert "autoscaling" not in assess(_body(status=status), TARGET, "2026-12-03T10:00:00Z"
                                       ).patch()
    assert "autoscaling" not in assess(_body(status=status, autoscaling={"maxReplicas": 8}),
                                       None, "2026-12-03T10:00:00Z").patch()


AUTOSCALER_CONDITION = {"type": "MetricsAvailable", "status": "False", "observedGeneration": 1,
                        "lastTransitionTime": "2026-12-03T10:00:05Z", "reason": "MetricsMissing",
                        "message": "queue: no series"}
AUTOSCALER_DECISION = {"time": "2026-12-03T10:00:05Z", "feature": "autoscaling",
                       "action": "ScaleOut 2 -> 3", "reason": "queue 40/replica",
                       "applied": True}


def test_the_lists_are_merged_into_the_stored_ones_keeping_the_autoscalers_entries() -> None:
    """The handled event predates an autoscaler write: its condition and decision must survive
    the controller's write (kopf applies merge_lists to the newest body)."""
    scaling = {"maxReplicas": 8}
    result = assess(_body(autoscaling=scaling), TARGET, "2026-12-03T10:00:00Z")
    newest = _body(status={"conditions": [AUTOSCALER_CONDITION],
                           "decisions": [AUTOSCALER_DECISION]}, autoscaling=scaling)
    result.merge_lists(newest)
    conditions = newest["status"]["conditions"]
    assert conditions[0] == AUTOSCALER_CONDITION
    assert [c["type"] for c in conditions[1:]] == ["TargetFound", "Ready", "DryRun"]
    assert newest["status"]["decisions"][0] == AUTOSCALER_DECISION
    assert newest["status"]["decisions"][1]["action"] == "generation 1: Accepted"


def test_what_the_autoscaler_wrote_goes_with_spec_autoscaling() -> None:
    """spec.autoscaling removed: ScalingActive and MetricsAvailable stayed as last written
    (an older observedGeneration, forever), and status.autoscaling with its writtenReplicas,
    which took the replicas someone set meanwhile for a revert once autoscaling was back."""
    stored = {"conditions": [AUTOSCALER_CONDITION,
                             {**AUTOSCALER_CONDITION, "type": "ScalingActive"},
                             {**AUTOSCALER_CONDITION, "type": "ScalingLimited"}],
              "decisions": [AUTOSCALER_DECISION],
              "autoscaling": {"writtenReplicas": 6, "currentReplicas": 6},
              # Batching Auto's applied value came back with Auto, re-creating every pod.
              "batching": {"knob": "max-num-seqs", "applied": 32}}
    result = assess(_body(generation=2, status=stored), TARGET, "2026-12-03T10:00:00Z")
    newest = _body(generation=2, status=copy.deepcopy(stored))
    result.merge_lists(newest)
    assert [c["type"] for c in newest["status"]["conditions"]] == [
        "TargetFound", "Ready", "DryRun"]
    assert "autoscaling" not in newest["status"] and "batching" not in newest["status"]
    # The pods' revision changes with it: said.
    assert [(n.reason, n.message) for n in result.notices if n.reason == "BatchingApplied"] == [
        ("BatchingApplied", "spec.autoscaling was removed, so batching mode Auto no longer "
         "sets --max-num-seqs 32: re-tuning replaces the pods with the pod template's value")]
    assert newest["status"]["decisions"][0] == AUTOSCALER_DECISION  # history stays
    # Handled from an older event, while the newest body has spec.autoscaling again: kept.
    back = _body(generation=3, status=copy.deepcopy(stored), autoscaling={"maxReplicas": 8})
    result.merge_lists(back)
    assert {"MetricsAvailable", "ScalingActive", "ScalingLimited"} <= {
        c["type"] for c in back["status"]["conditions"]}
    assert back["status"]["autoscaling"] == stored["autoscaling"]
    assert back["status"]["batching"] == stored["batching"]


def _written(result: Any, body: dict[str, Any]) -> None:
    """What kopf does with the handler's patch: the merge patch, then merge_lists."""
    body.setdefault("status", {}).update(result.patch())
    result.merge_lists(body)


def test_merging_keeps_the_transition_time_of_an_unchanged_condition() -> None:
    first = _body()
    _written(assess(first, TARGET, "2026-12-03T10:00:00Z"), first)
    again = assess(_body(generation=2, status=first["status"]), TARGET, "2026-12-03T11:00:00Z")
    again.merge_lists(first)
    ready = next(c for c in first["status"]["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "2026-12-03T10:00:00Z"
    assert ready["observedGeneration"] == 2


def test_merging_what_is_stored_already_changes_nothing() -> None:
    """kopf sends the difference merge_lists makes: none, when the lists hold it already."""
    stored = _body()
    _written(assess(stored, TARGET, "2026-12-03T10:00:00Z"), stored)
    before = copy.deepcopy(stored)
    assess(stored, TARGET, "2026-12-03T10:05:00Z").merge_lists(stored)
    assert stored == before


def test_an_invalid_spec_is_posted_as_a_warning() -> None:
    result = assess(_body(autoscaling={"minReplicas": 9, "maxReplicas": 2}), TARGET,
                    "2026-12-03T10:00:00Z")
    assert [(n.type, n.reason) for n in result.notices] == [("Warning", "InvalidSpec")]
    assert [c.type for c in result.conditions] == ["Ready"]
    # Once per generation, as every other reason: it was posted again at each re-assessment
    # (each restart, twice per deletion of the target Deployment).
    stored = _body(autoscaling={"minReplicas": 9, "maxReplicas": 2})
    _written(result, stored)
    assert assess(stored, TARGET, "2026-12-03T10:05:00Z").notices == []
    changed = _body(generation=2, status=stored["status"],
                    autoscaling={"minReplicas": 8, "maxReplicas": 2})
    assert [n.reason for n in assess(changed, TARGET, "2026-12-03T10:06:00Z").notices] == [
        "InvalidSpec"]


def test_the_last_valid_spec_is_kept_for_the_pods_of_an_invalid_one() -> None:
    """status.appliedSpec: the pod webhook tunes new pods by it while a newer generation is
    invalid. Each valid generation replaces it whole (a section removed from the spec goes
    from it too); an invalid one, or an older assessment landing late, leaves it."""
    stored = _body(generation=3, memory={"high": "6Gi"}, mig={"profile": "3g.71gb"})
    # Its own uid: a (uid, generation) names one spec, and the other tests' differ.
    stored["metadata"]["uid"] = "u-applied"
    _written(assess(stored, TARGET, "2026-12-03T10:00:00Z"), stored)
    assert stored["status"]["appliedSpec"] == {"generation": 3, "spec": stored["spec"]}
    invalid = _body(generation=4, status=stored["status"], memory={"high": "6Gi"},
                    autoscaling={"minReplicas": 9, "maxReplicas": 2})
    invalid["metadata"]["uid"] = "u-applied"
    result = assess(invalid, TARGET, "2026-12-03T10:05:00Z")
    _written(result, invalid)
    assert invalid["status"]["appliedSpec"]["generation"] == 3
    ready = find(result.status.conditions, ConditionType.READY)
    assert ready is not None and ready.message.endswith(
        "Meanwhile new pods are tuned as generation 3 of the spec said (status.appliedSpec)")
    fixed = _body(generation=5, status=invalid["status"], memory={"high": "7Gi"})
    _written(assess(fixed, TARGET, "2026-12-03T10:06:00Z"), fixed)
    assert fixed["status"]["appliedSpec"] == {"generation": 5, "spec": {
        "targetRef": {"name": "qwen"}, "engine": "vllm", "memory": {"high": "7Gi"}}}
    late = assess(_body(generation=3, memory={"high": "6Gi"}), TARGET, "2026-12-03T10:07:00Z")
    late.merge_lists(fixed)
    assert fixed["status"]["appliedSpec"]["generation"] == 5
    never = assess(_body(autoscaling={"minReplicas": 9, "maxReplicas": 2}), TARGET,
                   "2026-12-03T10:00:00Z")
    ready = find(never.status.conditions, ConditionType.READY)
    assert ready is not None and ready.message.endswith(
        "Meanwhile new pods are admitted untuned (no earlier generation of the spec was valid)")


def test_a_decision_another_writer_recorded_meanwhile_is_not_recorded_twice() -> None:
    """Two writers that read the status before either wrote (both operators of a rolling
    upgrade; the resume handler and the Deployment watch at a start) each appended it."""
    read = _body(status={})
    gone = assess(read, None, "2026-12-03T10:00:00Z")
    newest = copy.deepcopy(read)
    _written(assess(read, None, "2026-12-03T10:00:01Z"), newest)  # the other writer's
    assert gone.said_in(newest["status"])
    gone.merge_lists(newest)
    assert [d["action"] for d in newest["status"]["decisions"]] == [
        "generation 1: TargetNotFound"]
    # The same again after another one in between is news.
    _written(assess(copy.deepcopy(newest), TARGET, "2026-12-03T10:01:00Z"), newest)
    gone.merge_lists(newest)
    assert [d["action"] for d in newest["status"]["decisions"]] == [
        "generation 1: TargetNotFound", "generation 1: Accepted",
        "generation 1: TargetNotFound"]
    # Only Accepted applied anything: a decision that applied nothing said applied: true.
    assert [d["applied"] for d in newest["status"]["decisions"]] == [False, True, False]
    assert not gone.said_in(_body(status={})["status"])


def test_only_a_target_deployments_deletion_or_return_reaches_the_handler() -> None:
    """kopf runs and logs a handler for every event its filter lets through; the cluster's
    other Deployments, and a target's routine changes, must not get that far."""
    from infertune.controller.handlers import _target_news

    index = {("ml", "qwen"): [{"name": "qwen", "ready": "Accepted"}],
             ("ml", "late"): [{"name": "late", "ready": "TargetNotFound"}]}
    news = [(kind, ns, name) for kind in (None, "ADDED", "MODIFIED", "DELETED")
            for ns, name in (("ml", "qwen"), ("ml", "late"), ("ml", "other"), ("x", "qwen"))
            if _target_news(type=kind, namespace=ns, name=name,
                            tunings_by_target=index)]  # type: ignore[arg-type]
    assert news == [(None, "ml", "late"), ("ADDED", "ml", "late"), ("MODIFIED", "ml", "late"),
                    ("DELETED", "ml", "qwen"), ("DELETED", "ml", "late")]


def test_a_deployment_edit_that_settles_spec_container_reaches_the_handler() -> None:
    """Renaming the container into the pod template left Ready at ContainerNotFound (and
    renaming it out left Accepted) until the tuning itself changed."""
    from infertune.controller.handlers import _target_news

    def deployment(*names: str) -> dict[str, Any]:
        return {"spec": {"template": {"spec": {"containers": [{"name": n} for n in names]}}}}

    missing = {("ml", "qwen"): [{"name": "qwen", "ready": "ContainerNotFound",
                                 "spec": {"container": "engine"}}]}
    accepted = {("ml", "qwen"): [{"name": "qwen", "ready": "Accepted",
                                  "spec": {"container": "engine"}}]}
    unnamed = {("ml", "qwen"): [{"name": "qwen", "ready": "Accepted", "spec": {}}]}

    def news(index: Any, body: dict[str, Any]) -> bool:
        return _target_news(type="MODIFIED", namespace="ml", name="qwen",
                            tunings_by_target=index, body=body)

    assert news(missing, deployment("engine", "sidecar"))
    assert not news(missing, deployment("vllm"))  # still missing: nothing new
    assert news(accepted, deployment("vllm"))
    assert not news(accepted, deployment("engine"))  # a routine change
    assert not news(unnamed, deployment("vllm"))


@pytest.mark.parametrize(("spec", "target", "reason"), [
    ({"autoscaling": {}}, None, "TargetNotFound"),
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, TARGET, "InvalidSpec"),
])
def test_the_autoscalers_conditions_say_when_it_evaluates_nothing(
        spec: dict[str, Any], target: Any, reason: str) -> None:
    """The autoscaler writes nothing while the target is gone or the spec invalid: its last
    ScalingActive=True Scaling and MetricsAvailable=True Found stood, with kubectl describe
    saying autoscaling worked."""
    stamp = "2026-12-03T09:00:00Z"
    stored = {"conditions": [
        {"type": "ScalingActive", "status": "True", "reason": "Scaling", "message": "m",
         "lastTransitionTime": stamp, "observedGeneration": 1},
        {"type": "MetricsAvailable", "status": "True", "reason": "Found", "message": "m",
         "lastTransitionTime": stamp, "observedGeneration": 1},
        {"type": "ScalingLimited", "status": "True", "reason": "TooManyReplicas",
         "message": "m", "lastTransitionTime": stamp, "observedGeneration": 1}]}
    body = _body(generation=2, status=stored, **spec)
    result = assess(body, target, "2026-12-03T10:00:00Z")
    result.merge_lists(body)
    by_type = {c["type"]: c for c in body["status"]["conditions"]}
    assert (by_type["ScalingActive"]["status"], by_type["ScalingActive"]["reason"]) == (
        "False", reason)
    assert by_type["MetricsAvailable"]["status"] == "Unknown"
    # Not TooManyReplicas from the last evaluation either.
    assert (by_type["ScalingLimited"]["status"], by_type["ScalingLimited"]["reason"]) == (
        "Unknown", "NotEvaluated")
    # A tuning the autoscaler never reported on gets none of them.
    fresh = _body(generation=2, **spec)
    assess(fresh, target, "2026-12-03T10:00:00Z").merge_lists(fresh)
    assert {c["type"] for c in fresh["status"]["conditions"]}.isdisjoint(
        {"ScalingActive", "MetricsAvailable", "ScalingLimited"})


def test_a_deployment_edit_is_no_news_to_a_tuning_whose_spec_is_invalid() -> None:
    """Ready InvalidSpec with spec.container missing from the Deployment: every edit of the
    Deployment re-assessed the tuning (two reads, a status write and a Warning Event)."""
    from infertune.controller.handlers import _target_news

    index = {("ml", "qwen"): [{"name": "qwen", "ready": "InvalidSpec",
                               "spec": {"container": "engine"}}]}
    body = {"spec": {"template": {"spec": {"containers": [{"name": "vllm"}]}}}}
    assert not _target_news(type="MODIFIED", namespace="ml", name="qwen",
                            tunings_by_target=index, body=body)  # type: ignore[arg-type]


def test_a_tuning_with_spec_mig_says_mig_is_off_in_an_operator_without_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-mig: spec.mig is accepted (the rest of its tuning goes on), and Ready says that
    nothing partitions for it, where it said "MIG 3g.71gb" as if it would."""
    body = _body(mig={"profile": "3g.71gb"})
    ready = next(c for c in assess(body, TARGET, "2026-12-03T10:00:00Z").conditions
                 if c.type == "Ready")
    assert "MIG 3g.71gb" in ready.message and "not acted on" not in ready.message
    monkeypatch.setenv("INFERTUNE_MIG", "off")
    ready = next(c for c in assess(body, TARGET, "2026-12-03T10:00:00Z").conditions
                 if c.type == "Ready")
    assert ready.status.value == "True"
    assert "MIG not acted on: this operator runs without MIG partitioning" in ready.message


def test_a_status_block_this_release_does_not_know_is_left_out_not_the_whole_status() -> None:
    """A newer operator's block, kept after a rollback (the CRD stays): the whole status was
    unreadable, so every assessment started afresh and posted its Ready Event again."""
    stored = _body()
    _written(assess(stored, TARGET, "2026-12-03T10:00:00Z"), stored)
    stored["status"]["fromANewerRelease"] = {"x": 1}
    again = assess(stored, TARGET, "2026-12-03T10:05:00Z")
    assert again.notices == [] and again.decision is None
    # A field a newer release added inside a known block: that block is left out.
    del stored["status"]["fromANewerRelease"]
    stored["status"]["autoscaling"] = {"currentReplicas": 4, "newField": 1,
                                       "evaluated": "2026-12-03T10:04:00Z"}
    read = previous_status(stored["status"])
    assert read.conditions and read.observed_generation == 1
    # Known to be the autoscaler's, so the Deployment's count is not written over its own.
    assert read.autoscaling is not None and read.autoscaling.evaluated is not None
    again = assess({**stored, "spec": {**stored["spec"], "autoscaling": {}}}, TARGET,
                   "2026-12-03T10:06:00Z")
    assert again.notices == [] and again.current_replicas is None
