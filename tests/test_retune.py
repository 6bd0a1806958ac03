"""Re-tuning picks outdated pods to evict without taking more than maxUnavailable down."""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from infertune.api.spec import InferenceTuningSpec
from infertune.api.tuning import MemorySpec, RetuneStrategy
from infertune.tuning.retune import RETRY_S, Eviction, PodView, plan_retune


def _pods(*specs: tuple[str, str | None, bool]) -> list[PodView]:
    return [PodView(name, revision, ready) for name, revision, ready in specs]


def test_nothing_to_do_when_every_pod_is_current() -> None:
    step = plan_retune("r2", _pods(("a", "r2", True), ("b", "r2", True)), 1)
    assert step.evict == () and (step.tuned, step.outdated) == (2, 0)


def test_one_ready_outdated_pod_at_a_time() -> None:
    step = plan_retune("r2", _pods(("a", "r1", True), ("b", None, True), ("c", "r2", True)), 1)
    assert step.evict == ("a",) and step.outdated == 2


def test_waits_while_a_replacement_is_not_ready() -> None:
    step = plan_retune("r2", _pods(("a", "r1", True), ("b", "r2", False)), 1)
    assert step.evict == () and "waiting" in step.reason


def test_terminating_pods_count_as_unavailable_and_are_not_evicted_again() -> None:
    pods = [PodView("a", "r1", True, terminating=True), PodView("b", "r1", True)]
    assert plan_retune("r2", pods, 1).evict == ()


def test_unready_outdated_pods_go_first_and_cost_no_budget() -> None:
    step = plan_retune("r2", _pods(("a", "r1", True), ("b", "r1", False)), 1)
    assert step.evict == ("b",)


def test_pods_not_ready_are_evicted_within_max_unavailable_too() -> None:
    """Eight replicas whose readiness blipped under load, all outdated (a batching change):
    every one was evicted in one pass, a model reload on each. As the Deployment controller
    caps its clean-up of unhealthy pods, one goes; the next once its replacement is Ready."""
    blip = [PodView(f"p{i}", "r1", False) for i in range(8)]
    first = plan_retune("r2", blip, 1, desired=8)
    assert first.evict == ("p0",), first.reason
    loading = [*blip[1:], PodView("p0-new", "r2", False)]
    assert plan_retune("r2", loading, 1, desired=8).evict == ()
    served = [*blip[1:], PodView("p0-new", "r2", True)]
    assert plan_retune("r2", served, 1, desired=8).evict == ("p1",)


def test_max_unavailable_allows_several() -> None:
    step = plan_retune("r2", _pods(("a", "r1", True), ("b", "r1", True), ("c", "r1", True)), 2)
    assert step.evict == ("a", "b")


def _evicted(revision: str, known: list[str], evicted: list[str], at: float = 0.0,
             misses: int = 0) -> Eviction:
    return Eviction(revision, frozenset(known), frozenset(evicted), at, misses)


def test_eviction_pauses_when_a_replacement_comes_back_untuned() -> None:
    last = _evicted("r2", ["old", "gone"], ["gone"], at=100.0)
    pods = _pods(("old", None, True), ("new", None, True))
    step = plan_retune("r2", pods, 1, last, now=160.0)
    assert step.evict == () and "webhook did not tune" in step.reason
    assert step.missed == ("new",) and "trying again in 9 min" in step.reason
    assert plan_retune("r2", pods, 1).evict == ("new",)


def test_the_guard_goes_by_the_pods_known_at_the_eviction_not_by_clocks() -> None:
    """Creation times are the API server's, whole seconds: a pod created in the same second
    as the eviction (but before it) paused eviction for good, and an operator whose clock ran
    ahead never paused at all."""
    last = _evicted("r2", ["a", "b", "c"], ["a"], at=100.0)
    pods = [PodView("b", None, True), PodView("c", None, True), PodView("a2", "r2", True)]
    step = plan_retune("r2", pods, 1, last, now=130.0)
    assert step.missed == () and step.evict == ("b",)


def test_a_paused_eviction_tries_again_later_and_backs_off() -> None:
    """A pause used to last until the untuned pod was deleted by hand, after the webhook was
    long fixed."""
    pods = _pods(("old", None, True), ("new", None, True))
    last = _evicted("r2", ["old", "gone"], ["gone"], at=100.0)
    assert plan_retune("r2", pods, 1, last, now=100.0 + RETRY_S - 1).evict == ()
    step = plan_retune("r2", pods, 1, last, now=100.0 + RETRY_S)
    assert step.evict == ("new",) and step.missed == ("new",)
    again = step.eviction("r2", pods, ["new"], 100.0 + RETRY_S, last)
    assert again.misses == 1 and again.retry_at() == 100.0 + 3 * RETRY_S
    # A replacement that came back tuned ends the backoff.
    fine = plan_retune("r2", _pods(("old", None, True), ("new2", "r2", True)), 1, again,
                       now=again.at + 60)
    assert fine.missed == () and fine.eviction("r2", [], ["old"], 0.0, again).misses == 0
    # Another revision starts over.
    assert plan_retune("r3", pods, 1, last, now=101.0).evict == ("new",)


def test_a_pod_evicted_but_still_live_in_the_index_is_down_and_not_evicted_again() -> None:
    last = _evicted("r2", ["a", "b", "c"], ["a"], at=100.0)
    step = plan_retune("r2", _pods(("a", "r1", True), ("b", "r1", True), ("c", "r1", True)), 1,
                       last, now=101.0)
    assert step.evict == () and "waiting for 1 unavailable" in step.reason


def test_replicas_the_deployment_wants_but_has_not_created_are_unavailable() -> None:
    """3 replicas wanted, 2 pods (a quota refused one): one is down already."""
    pods = _pods(("a", "r1", True), ("b", "r2", True))
    assert plan_retune("r2", pods, 1, desired=3).evict == ()
    assert plan_retune("r2", pods, 1, desired=2).evict == ("a",)


def test_the_only_ready_pod_is_never_evicted() -> None:
    """One replica: its replacement loads the model for minutes, with nothing serving."""
    step = plan_retune("r2", _pods(("a", "r1", True)), 1, desired=1)
    assert step.evict == () and step.outdated == 1
    assert "a is the only Ready pod" in step.reason and "PodTemplateAnnotation" in step.reason
    # One that is not Ready costs nothing, and the last Ready one stays.
    step = plan_retune("r2", _pods(("a", "r1", True), ("b", "r1", False)), 2, desired=2)
    assert step.evict == ("b",)


# ---- the controller's pass (pods.retune), with the Kubernetes calls replaced -----------------

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tgi-l4-no-mig.yaml"


@pytest.fixture
def controller(monkeypatch: pytest.MonkeyPatch) -> Any:
    """pods.retune on the example's tuning and Deployment (`replicas` of it), recording the
    evictions it asks for; `evict_error` makes the Eviction API answer with that status."""
    import kopf
    from kubernetes import client

    from infertune.api.spec import InferenceTuning
    from infertune.controller import pods as controller_pods

    docs = list(yaml.safe_load_all(EXAMPLE.read_text()))
    deployment_body = next(d for d in docs if d["kind"] == "Deployment")
    for container in deployment_body["spec"]["template"]["spec"]["containers"]:
        for amounts in container["resources"].values():  # as the API server returns them
            amounts.update({k: str(v) for k, v in amounts.items()})
    tuning = InferenceTuning.model_validate(next(d for d in docs
                                                 if d["kind"] == "InferenceTuning"))
    state: dict[str, Any] = {"replicas": 3, "exists": True, "evicted": [], "evict_error": None,
                             "template_revision": None, "annotations": [], "spec": tuning.spec,
                             "strategy": None, "status": None, "paused": False}

    def read_deployment(namespace: str, name: str) -> Any:
        if not state["exists"]:
            return None
        template = deployment_body["spec"]["template"]
        if state["template_revision"] is not None:
            template = {**template, "metadata": {**template["metadata"], "annotations": {
                "infertune.io/revision": state["template_revision"]}}}
        body = {**deployment_body, "spec": {**deployment_body["spec"], "template": template,
                                            "replicas": state["replicas"]}}
        if state["strategy"] is not None:
            body["spec"]["strategy"] = state["strategy"]
        if state["paused"]:
            body["spec"]["paused"] = True
        if state["status"] is not None:
            body = {**body, "metadata": {**body["metadata"], "generation": 2},
                    "status": state["status"]}
        return client.ApiClient().deserialize(json.dumps(body), "V1Deployment",
                                              "application/json")

    def evict_pod(namespace: str, name: str) -> bool:
        if state["evict_error"] is not None:
            raise ApiException(status=state["evict_error"], reason="Internal Server Error")
        state["evicted"].append(name)
        return True

    monkeypatch.setattr(controller_pods, "read_deployment", read_deployment)
    monkeypatch.setattr(controller_pods, "evict_pod", evict_pod)

    def annotate(namespace: str, deployment: str, revision: str) -> None:
        state["annotations"].append(revision)
        state["template_revision"] = revision

    monkeypatch.setattr(controller_pods, "_annotate_template", annotate)
    state["events"] = []
    monkeypatch.setattr(kopf, "event", lambda owner, *, type, reason, message:
                        state["events"].append((type, reason, message)))
    memo = kopf.Memo(pod_tuning=controller_pods.PodTuningSettings(
        launcher_image="l:1", excluded_namespaces=("kube-system", "infertune-system")))

    def run(pods: list[PodView], rivals: tuple[str, ...] = (), namespace: str = "chat") -> str:
        status = controller_pods.retune(namespace, "mistral-7b", "uid-1", state["spec"], pods,
                                        memo, rivals=rivals)
        return str(status.message)

    state["run"] = run
    state["memo"] = memo
    state["deployment"] = deployment_body  # as read: a test may change its template
    return state


def _outdated(count: int) -> list[PodView]:
    return [PodView(f"mistral-7b-6b7c9d-{i:05d}", None, True) for i in range(count)]


def test_the_pass_evicts_within_the_deployments_replicas(controller: Any) -> None:
    message = controller["run"](_outdated(3))
    assert controller["evicted"] == ["mistral-7b-6b7c9d-00000"], message
    # Each eviction is an action of the operator's, and says so in an Event.
    ((kind, reason, said),) = controller["events"]
    assert (kind, reason) == ("Normal", "PodsRetuned")
    assert said.startswith("evicted mistral-7b-6b7c9d-00000 to re-create them with revision")
    controller["evicted"].clear()
    controller["replicas"] = 4  # one wanted, not created yet: already one down
    assert "waiting for" in controller["run"](_outdated(3)[1:])
    assert controller["evicted"] == []


class LostLease:
    """A leader election this process no longer leads (loops.leader_of)."""

    exclusive = True

    def leads(self) -> bool:
        return False


def test_a_pass_that_lost_the_lease_during_the_deployment_read_evicts_nothing(
        controller: Any) -> None:
    """The read waited on an API server under load past the leadership: two processes then
    evicted at once, twice the pods down."""
    controller["memo"]["leader"] = LostLease()
    message = controller["run"](_outdated(3))
    assert controller["evicted"] == [] and controller["events"] == []
    assert "none replaced by this process: it no longer leads" in message


def test_two_tunings_of_one_deployment_replace_nothing_and_say_so(controller: Any) -> None:
    """The webhook tunes no pod of such a Deployment: evicting only restarted pods, which
    came back untuned, and then paused for good."""
    message = controller["run"](_outdated(3), rivals=("mistral-7b-v2",))
    assert controller["evicted"] == []
    assert "InferenceTunings mistral-7b, mistral-7b-v2 all target Deployment mistral-7b" in \
        message


def test_a_trial_beside_the_tuning_in_force_says_whose_the_pods_are(controller: Any) -> None:
    """The webhook tunes them by the one in force; the trial (mode DryRun) replaces nothing
    and says so, rather than that both target the Deployment and none tunes it."""
    from infertune.api.spec import Mode
    from infertune.controller import pods as controller_pods
    trial = controller["spec"].model_copy(update={"mode": Mode.DRY_RUN})
    status = controller_pods.retune("chat", "mistral-7b", "uid-1", trial, _outdated(3),
                                    controller["memo"], rivals=("mistral-7b-live",),
                                    tuned_by="mistral-7b-live")
    assert controller["evicted"] == [] and controller["events"] == []
    assert status.message == (
        "dry run: 3 pods outdated, none replaced; the pods are tuned by InferenceTuning "
        "mistral-7b-live (mode Enforce): this trial reports its plan here and does not "
        "annotate them")
    # Beside two in force, which tune none; beside trials only, which annotate none.
    beside_two = controller_pods.retune("chat", "mistral-7b", "uid-1", trial, _outdated(3),
                                        controller["memo"], rivals=("a", "b"))
    assert beside_two.message == (
        "dry run: 3 pods outdated, none replaced; InferenceTunings a, b all target Deployment "
        "mistral-7b in mode Enforce, and the webhook tunes its pods by none of them")
    trials = controller_pods.retune("chat", "mistral-7b", "uid-1", trial, _outdated(3),
                                    controller["memo"], rivals=("u",), rivals_forced=False)
    assert trials.message == (
        "dry run: 3 pods outdated, none replaced; InferenceTunings mistral-7b, u are all "
        "trials (mode DryRun) of Deployment mistral-7b, and none annotates its pods until "
        "only one is left")
    assert controller["evicted"] == []


@pytest.mark.parametrize(("own", "entries", "passed"), [
    # The one in force beside a trial replaces its pods (it stopped before).
    ("a", "aT", ((), None, True)),
    ("a", "Ta", ((), None, True)),
    # The trial beside it leaves them to it.
    ("t", "aT", (("a",), "a", True)),
    # Two in force: each is the other's rival, the trial is no one's.
    ("a", "abT", (("b",), None, True)),
    ("t", "abT", (("a", "b"), None, True)),
    # Two trials alone.
    ("t", "TU", (("u",), None, False)),
])
def test_retuning_counts_a_trial_beside_the_tuning_in_force_as_no_rival(
        monkeypatch: pytest.MonkeyPatch, own: str, entries: str,
        passed: tuple[Any, ...]) -> None:
    """What the re-tuning daemon hands `retune` (rivals, tuned_by, rivals_forced), read from
    the index as kopf gives it. Upper case: a trial (mode DryRun)."""
    import asyncio
    import logging

    import kopf

    from infertune.controller import pods as controller_pods

    captured: dict[str, Any] = {}

    async def every(interval: float, read: Any, **_: Any) -> None:
        captured["read"] = read

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(controller_pods, "every", every)
    monkeypatch.setattr(controller_pods, "retune", lambda *args: calls.append(args) or
                        controller_pods.TuningStatus(revision="r", tuned_pods=0,
                                                     outdated_pods=0, message=""))

    def spec_of(letter: str) -> dict[str, Any]:
        return {"targetRef": {"name": "qwen"}, "engine": "vllm",
                **({"mode": "DryRun"} if letter.isupper() else {})}

    index = {("ml", "qwen"): [{"name": e.lower(), "uid": f"u-{e.lower()}", "generation": 1,
                               "spec": spec_of(e)} for e in entries]}
    asyncio.run(controller_pods.retune_pods(
        stopped=None, namespace="ml", name=own, uid=f"u-{own}", body=kopf.Body({}),
        memo=kopf.Memo(pod_tuning=controller_pods.PodTuningSettings(launcher_image="l:1")),
        logger=logging.getLogger("test"), pods_by_deployment={}, tunings_by_target=index))
    own_spec = spec_of(next(e for e in entries if e.lower() == own))
    stored = {"revision": "r", "problems": ["as the last pass said"]}
    work = captured["read"](own_spec, {"tuning": stored}, {"generation": 1})
    work()
    assert calls[-1][8:11] == passed
    assert calls[-1][11] == stored  # what the last pass stored, for a restarted operator


def test_a_missing_deployment_is_reported_not_an_eviction(controller: Any) -> None:
    controller["exists"] = False
    message = controller["run"](_outdated(2))
    assert controller["evicted"] == []
    assert "none replaced: Deployment chat/mistral-7b not found" in message


def test_an_eviction_the_api_server_fails_is_reported(controller: Any) -> None:
    """A 500 (a pod under two budgets) or 403 ended the pass without a status write, and the
    status kept the old revision's 'all pods carry revision ...'."""
    controller["evict_error"] = 500
    message = controller["run"](_outdated(3))
    assert "evicting mistral-7b-6b7c9d-00000 failed: 500 Internal Server Error" in message


def test_pods_of_a_namespace_the_webhook_leaves_out_are_never_replaced(
        controller: Any) -> None:
    """A tuning in kube-system (or the operator's namespace): the registration never sends
    its pods, so each replacement came back untuned and was evicted again when the pause ran
    out, a model reload every time."""
    message = controller["run"](_outdated(3), namespace="kube-system")
    assert controller["evicted"] == [] and controller["events"] == []
    assert message.startswith("pods of namespace kube-system are never sent to the "
                              "operator's webhook"), message


def test_replacing_goes_by_what_the_webhook_did_with_the_last_pod_of_the_revision(
        controller: Any) -> None:
    """The webhook sees the pod after the namespace's LimitRange filled in its limits, which
    the Deployment's template does not have: judged on the template, pods the webhook then
    refused were evicted (and came back untuned, again and again), and pods it would tune
    were never replaced."""
    from infertune.api.spec import InferenceTuningSpec
    from infertune.tuning.pod_patch import tuning_revision

    revision = tuning_revision(controller["spec"])
    why = "spec.memory.high: 28Gi is above the memory limit 24Gi minus minHeadroom 1Gi"

    def admitted(said: str) -> list[PodView]:  # the newest pod, as the webhook left it
        return [*_outdated(3), PodView("mistral-7b-6b7c9d-new", None, True, untuned=said,
                                       created=2000.0)]
    message = controller["run"](admitted(f"{revision}: {why}"))
    assert controller["evicted"] == [], message
    assert message == f"4 pods not tuned, none replaced: {why}"
    # A refusal at another revision says nothing about this one: the template decides (this
    # Deployment has a memory limit, so it would be tuned).
    controller["memo"].pod_tuning.last_evictions.clear()
    controller["evicted"].clear()
    controller["run"](admitted("another: spec.memory.high: refused then"))
    assert controller["evicted"] == ["mistral-7b-6b7c9d-00000"]
    # The other way: above the template's 16Gi limit, under the pods' larger one.
    high = InferenceTuningSpec.model_validate({
        **controller["spec"].model_dump(by_alias=True, exclude_none=True),
        "memory": {"high": "20Gi"}})
    controller["spec"] = high
    tuned = replace(_tuned(controller, "mistral-7b-6b7c9d-new")[0], created=2000.0)
    controller["memo"].pod_tuning.last_evictions.clear()
    controller["evicted"].clear()
    said = controller["run"]([*_outdated(3), tuned])
    assert controller["evicted"] == ["mistral-7b-6b7c9d-00000"], said
    # No pod of the revision: the template alone refuses it.
    controller["memo"].pod_tuning.last_evictions.clear()
    controller["evicted"].clear()
    assert "none replaced: spec.memory.high: 20Gi is above" in controller["run"](_outdated(3))
    assert controller["evicted"] == []


OWNED = {("chat", "mistral-7b-6b7c9d"): ["mistral-7b"]}
"""The ReplicaSet index as kopf holds it: mistral-7b-6b7c9d is Deployment mistral-7b's."""


def _indexed_under(replicaset_owners: dict[tuple[str, str], list[str]] = OWNED,
                   phase: str = "Running", labels: dict[str, str] | None = None) -> str | None:
    """The Deployment pods_by_deployment files a pod of ReplicaSet mistral-7b-6b7c9d under,
    None when it leaves the pod out."""
    import asyncio

    from infertune.controller.pods import pods_by_deployment

    pod = {"metadata": {"name": "mistral-7b-6b7c9d-abcde", "namespace": "chat",
                        "labels": {"pod-template-hash": "6b7c9d", **(labels or {})},
                        "ownerReferences": [{"kind": "ReplicaSet", "name": "mistral-7b-6b7c9d",
                                             "controller": True}]},
           "status": {"phase": phase}}
    got = asyncio.run(pods_by_deployment(namespace="chat", name="p", body=pod,
                                         replicaset_owners=replicaset_owners))
    return None if got is None else next(iter(got))[1]


def test_pods_of_an_orphaned_replicaset_are_no_deployments() -> None:
    """After `kubectl delete deployment --cascade=orphan` (how a selector is changed), the old
    ReplicaSet's pods were taken, by its name, for those of the new Deployment of that name:
    tuned, counted and evicted as its replicas."""
    import asyncio

    from infertune.controller.pods import replicaset_owners

    def rs(owners: list[dict[str, Any]]) -> dict[str, Any]:
        return {"metadata": {"name": "mistral-7b-6b7c9d", "namespace": "chat",
                             "ownerReferences": owners}}

    orphan = asyncio.run(replicaset_owners(namespace="chat", name="mistral-7b-6b7c9d",
                                           body=rs([])))
    owned = asyncio.run(replicaset_owners(namespace="chat", name="mistral-7b-6b7c9d", body=rs(
        [{"kind": "Deployment", "name": "mistral-7b", "controller": True}])))
    assert (orphan, owned) == ({("chat", "mistral-7b-6b7c9d"): ""},
                               {("chat", "mistral-7b-6b7c9d"): "mistral-7b"})
    for index, indexed in (({("chat", "mistral-7b-6b7c9d"): [""]}, None),
                           (OWNED, "mistral-7b"),
                           ({}, "mistral-7b")):  # not listed yet: by the name, as before
        assert _indexed_under(index) == indexed, index


def test_pods_opted_out_of_tuning_are_not_replicas_to_re_tune() -> None:
    """infertune.io/tuning=disabled: the webhook is never called for the pod nor for its
    replacement. Counted as outdated, it was evicted over and over."""
    for labels, indexed in (({"infertune.io/tuning": "disabled"}, None),
                            ({"infertune.io/tuning": "enabled"}, "mistral-7b"),
                            ({}, "mistral-7b")):
        assert _indexed_under(labels=labels) == indexed, labels


def test_a_pod_that_ended_is_no_replica() -> None:
    """A Failed pod (kubelet eviction, node shutdown) counted as a replica that was down and
    outdated, and held re-tuning for good."""
    for phase, indexed in (("Running", "mistral-7b"), ("Pending", "mistral-7b"),
                           ("Failed", None), ("Succeeded", None)):
        assert _indexed_under(phase=phase) == indexed, phase


def test_the_pod_template_is_annotated_once_and_said_so(controller: Any) -> None:
    """PodTemplateAnnotation wrote the same annotation into the Deployment at every pass
    while the pods rolled, and no Event said that the operator started the rollout."""
    _by_template(controller)
    first = controller["run"](_outdated(3))
    again = controller["run"](_outdated(3))
    assert len(controller["annotations"]) == 1 and controller["evicted"] == []
    assert "pod template annotated with revision" in first
    assert "the pod template carries revision" in again
    ((kind, reason, said),) = controller["events"]
    assert (kind, reason) == ("Normal", "PodsRetuned") and "rolls out the 3 outdated" in said


def _by_template(controller: Any) -> None:
    """The fixture's tuning with spec.retune.strategy PodTemplateAnnotation."""
    from infertune.api.tuning import RetuneSpec, RetuneStrategy

    controller["spec"] = controller["spec"].model_copy(update={"retune": RetuneSpec(
        strategy=RetuneStrategy.POD_TEMPLATE_ANNOTATION)})


@pytest.mark.parametrize(("replicas", "strategy", "says"), [
    # Recreate stops every pod before the new ones start: GPU Deployments often use it.
    (4, {"type": "Recreate"}, "with strategy Recreate, which stops every pod before the new "
     "ones start: all 4 replicas down while the new pods load, nothing serving"),
    # One replica, no surge: the only pod goes first.
    (1, {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}},
     "its only replica down while the new pods load"),
    # As many as there are replicas.
    (2, {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%", "maxSurge": 1}},
     "a rolling update that takes up to 2 pods down: all 2 replicas down"),
])
def test_the_pod_template_is_not_annotated_where_the_rollout_would_take_too_many_down(
        controller: Any, replicas: int, strategy: dict[str, Any], says: str) -> None:
    """PodTemplateAnnotation hands the rollout to the Deployment's own strategy, whatever
    spec.retune.maxUnavailable says: with Recreate one annotation took every replica down
    for a whole model load (and the operator advised the strategy to one-replica users)."""
    _by_template(controller)
    controller["replicas"], controller["strategy"] = replicas, strategy
    message = controller["run"](_outdated(replicas))
    assert controller["annotations"] == [] and controller["evicted"] == []
    assert "none replaced: annotating the pod template would roll Deployment mistral-7b out " \
        in message and says in message, message
    # Said once as a Warning too, not only in status.
    controller["run"](_outdated(replicas))
    ((kind, reason, said),) = controller["events"]
    assert (kind, reason) == ("Warning", "RetuneHeld") and says in said


def test_the_pod_template_is_annotated_where_the_rollout_stays_within_the_limit(
        controller: Any) -> None:
    """The default rolling update (25%) of 1 replica starts the new pod first; of 4 it takes
    one down."""
    _by_template(controller)
    for replicas in (1, 4, 8):
        controller["replicas"] = replicas
        controller["template_revision"] = None
        message = controller["run"](_outdated(replicas))
        assert "pod template annotated with revision" in message, (replicas, message)
    # 25% of 8 is 2 at once: annotated (as any change of its template would roll), and said.
    assert message.endswith("(its rolling update takes up to 2 pods down at once, more than "
                            "spec.retune.maxUnavailable (1), which only Evict keeps to)"), message


def test_the_pod_template_rollout_is_said_as_the_deployment_has_it(controller: Any) -> None:
    """Once annotated, the message said "the Deployment rolls them out" for as long as
    untuned pods stayed, also after the rollout had ended or while the Deployment was
    paused."""
    _by_template(controller)
    controller["run"](_outdated(3))
    controller["status"] = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 1}
    assert "the Deployment rolls them out" in controller["run"](_outdated(2))
    # All updated, but the old pods still run beside them, or the new ones load: the rollout
    # is not done (said that the webhook had not tuned them, at the end of every rollout).
    for status in ({"replicas": 4, "updatedReplicas": 3, "availableReplicas": 3},
                   {"replicas": 3, "updatedReplicas": 3, "availableReplicas": 2}):
        controller["status"] = {"observedGeneration": 2, **status}
        assert "the Deployment rolls them out" in controller["run"](_outdated(1)), status
    controller["status"] = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3,
                            "availableReplicas": 3}
    done = controller["run"](_outdated(1))
    assert "Deployment mistral-7b has rolled it out, but they do not run it: the webhook " \
        "did not tune them" in done, done
    controller["paused"] = True
    assert "but Deployment mistral-7b is paused: resume it" in controller["run"](_outdated(1))
    assert len(controller["annotations"]) == 1


def test_no_pod_is_evicted_while_the_deployment_rolls_out(controller: Any) -> None:
    """Evicted mid-rollout, an old pod is re-created by the old ReplicaSet (a model load) only
    to be scaled away, and may take the GPU the next new pod needs; the new pods come
    through the webhook anyway."""
    controller["status"] = {"observedGeneration": 2, "replicas": 4, "updatedReplicas": 1}
    message = controller["run"](_outdated(3))
    assert controller["evicted"] == []
    assert message == ("3 pods outdated, none evicted while Deployment mistral-7b is rolling "
                       "out (1 of 3 pods updated, 3 old ones still running): the pods it "
                       "starts come through the webhook")
    controller["status"] = {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3}
    assert "has not acted on its newest spec yet" in controller["run"](_outdated(3))
    # A rollout that stopped is named.
    controller["status"] = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 1,
                            "conditions": [{"type": "Progressing", "status": "False",
                                            "reason": "ProgressDeadlineExceeded",
                                            "message": "ReplicaSet has timed out"}]}
    assert "(1 of 3 pods updated; stopped: ProgressDeadlineExceeded: ReplicaSet has timed " \
        "out)" in controller["run"](_outdated(3))
    controller["status"] = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3}
    controller["run"](_outdated(3))
    assert controller["evicted"] == ["mistral-7b-6b7c9d-00000"]
    # Paused with a change not rolled out: that is no rollout, and the pods the old
    # ReplicaSet re-creates come through the webhook (it waited for as long as it was paused).
    controller["evicted"].clear()
    controller["memo"].pod_tuning.last_evictions.clear()
    controller["paused"] = True
    controller["status"] = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 0}
    controller["run"](_outdated(3))
    assert controller["evicted"] == ["mistral-7b-6b7c9d-00000"]


def test_a_problem_that_went_away_and_came_back_is_said_again(controller: Any) -> None:
    """The Event of a pod problem was remembered for good: the same problem a day later,
    after pods had been tuned fine in between, posted nothing."""
    settings = controller["memo"].pod_tuning
    key = "chat/mistral-7b"
    problem = ("spec.memory.high: 9Gi is above the memory limit 8Gi",)

    def said() -> list[str]:
        return [reason for _, reason, _ in controller["events"] if reason == "PodNotTuned"]

    settings.unreported[key] = (problem, True)
    controller["run"]([])
    settings.unreported[key] = (problem, True)  # the next pod, the same problem
    controller["run"]([])
    assert len(said()) == 1
    settings.latest_problems[key] = []  # a pod admitted without one
    controller["run"]([])
    settings.unreported[key] = (problem, True)
    controller["run"]([])
    assert len(said()) == 2
    # The template held back, then not, then held again: said twice.
    _by_template(controller)
    controller["strategy"] = {"type": "Recreate"}
    controller["run"](_outdated(3))
    controller["strategy"] = None
    controller["run"](_outdated(3))
    controller["strategy"], controller["template_revision"] = {"type": "Recreate"}, None
    controller["run"](_outdated(3))
    assert [r for _, r, _ in controller["events"]].count("RetuneHeld") == 2


def test_what_is_kept_of_a_deleted_tuning_goes_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Made again under the same name, a tuning inherited it: its PodNotTuned Event was
    taken as said already, and the old problems showed in its status."""
    import asyncio
    import logging

    import kopf
    from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter

    from infertune.controller import loops
    from infertune.controller import pods as controller_pods

    monkeypatch.setattr(loops, "INITIAL_DELAY_S", 0.0)
    settings = controller_pods.PodTuningSettings(launcher_image="l:1")
    tables = (settings.unreported, settings.latest_problems, settings.problems_revision,
              settings.reported, settings.last_evictions, settings.backfilled)
    for table in tables:
        table["chat/mistral-7b"] = table["chat/other"] = ("kept",)  # type: ignore[assignment]
    settings.reported["chat/mistral-7b#RetuneHeld"] = ("kept",)
    settings.reported["chat/mistral-7b#MemoryHighNotUpdated"] = ("kept",)
    memo = kopf.Memo(pod_tuning=settings)
    setter: FlagSetter[Any] = FlagSetter()

    async def deleted() -> None:
        setter.set()  # as kopf does when the tuning is deleted
        await asyncio.wait_for(controller_pods.retune_pods(
            stopped=AsyncFlagWaiter(setter), namespace="chat", name="mistral-7b", uid="u1",
            body=kopf.Body({"metadata": {}, "spec": {}}), memo=memo,  # type: ignore[arg-type]
            logger=logging.getLogger("t"), pods_by_deployment={}, tunings_by_target={}),
            timeout=10)

    asyncio.run(deleted())
    for table in tables:
        assert list(table) == ["chat/other"]


def test_a_terminating_pod_is_indexed_with_when_it_is_gone_at_the_latest() -> None:
    """Its deletionTimestamp: batching mode Auto reads the running requests for a flag the
    engine ignores only from after it (an old pod finishing its requests weighs in the
    mean of the running requests until then)."""
    import asyncio

    from infertune.controller.pods import pods_by_deployment
    from infertune.scaling.state import parse_time

    pod: dict[str, Any] = {"metadata": {
        "name": "mistral-7b-6b7c9d-abcde", "namespace": "chat",
        "ownerReferences": [{"kind": "ReplicaSet", "name": "mistral-7b-6b7c9d",
                             "controller": True}]}, "status": {"phase": "Running"}}
    running = asyncio.run(pods_by_deployment(namespace="chat", name="p", body=pod,
                                             replicaset_owners=OWNED))
    assert running is not None
    (view,) = running.values()
    assert not view.terminating and view.gone_by is None
    pod["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:30Z"
    leaving = asyncio.run(pods_by_deployment(namespace="chat", name="p", body=pod,
                                             replicaset_owners=OWNED))
    assert leaving is not None
    (view,) = leaving.values()
    assert view.terminating and view.gone_by == parse_time("2026-12-06T12:00:30Z")


def test_a_ready_pod_is_indexed_with_when_it_became_ready() -> None:
    """Its Ready condition's lastTransitionTime, while Ready: the autoscaler counts the pods
    that joined from then (AutoscalingSettings.saw_pods)."""
    import asyncio

    from infertune.controller.pods import pods_by_deployment
    from infertune.scaling.state import parse_time

    def indexed(conditions: list[Any]) -> Any:
        pod = {"metadata": {"name": "mistral-7b-6b7c9d-abcde", "namespace": "chat",
                            "ownerReferences": [{"kind": "ReplicaSet",
                                                 "name": "mistral-7b-6b7c9d",
                                                 "controller": True}]},
               "status": {"phase": "Running", "conditions": conditions}}
        got = asyncio.run(pods_by_deployment(namespace="chat", name="p", body=pod,
                                             replicaset_owners=OWNED))
        assert got is not None
        (view,) = got.values()
        return view.ready, view.ready_since

    at = "2026-12-06T12:00:30Z"
    assert indexed([{"type": "PodScheduled", "status": "True", "lastTransitionTime": "x"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": at}]) == (
        True, parse_time(at))
    assert indexed([{"type": "Ready", "status": "False", "lastTransitionTime": at}]) == (
        False, None)
    assert indexed([{"type": "Ready", "status": "True"}]) == (True, None)
    assert indexed([{"type": "Ready", "status": "True", "lastTransitionTime": "soon"}]) == (
        True, None)
    assert indexed(["not a condition", {"type": "Ready", "status": "True",
                                        "lastTransitionTime": at}]) == (True, parse_time(at))


def test_a_pod_is_indexed_with_its_shape_memory_intent_and_containers_memory() -> None:
    import asyncio

    from infertune.controller.pods import pods_by_deployment

    pod: dict[str, Any] = {"metadata": {
        "name": "mistral-7b-6b7c9d-abcde", "namespace": "chat",
        "labels": {"infertune.io/revision": "r1", "infertune.io/shape": "s1"},
        "annotations": {"infertune.io/memory-high": "123",
                        "infertune.io/serving-container": "tgi"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "mistral-7b-6b7c9d",
                             "controller": True}]},
        "spec": {"containers": [
            {"name": "proxy", "resources": {"requests": {"memory": "64Mi"}}},
            {"name": "tgi", "resources": {"limits": {"memory": "16Gi"}}},
            {"name": "bare"}]},
        "status": {"phase": "Running"}}
    indexed = asyncio.run(pods_by_deployment(namespace="chat", name="p", body=pod,
                                             replicaset_owners=OWNED))
    assert indexed is not None
    (view,) = indexed.values()
    assert (view.revision, view.shape, view.serving, view.memory_high) == ("r1", "s1", "tgi",
                                                                           "123")
    assert view.memory == (("proxy", "64Mi", None), ("tgi", "16Gi", "16Gi"),
                           ("bare", None, None))


# ---- spec.memory: taken in place by running pods ---------------------------------------------

TGI = (("tgi", "12Gi", "16Gi"),)
"""The example's serving container: (name, memory request, memory limit)."""


def _tuned(controller: Any, *names: str, memory_high: str | None = None,
           memory: tuple[tuple[str, str | None, str | None], ...] = TGI,
           serving: str | None = "tgi") -> list[PodView]:
    """Pods the webhook tuned by the spec as it is now."""
    from infertune.tuning.pod_patch import shape_revision, tuning_revision
    spec = controller["spec"]
    return [PodView(n, tuning_revision(spec), True, shape=shape_revision(spec), serving=serving,
                    memory_high=memory_high, memory=memory) for n in names]


def _with_memory(controller: Any, memory: dict[str, Any]) -> None:
    controller["spec"] = controller["spec"].model_copy(
        update={"memory": MemorySpec.model_validate(memory)})


@pytest.fixture
def patched(controller: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any, Any]]:
    """The pod patches of the pass, as (pod, revision label, memory.high annotation);
    controller["patch_errors"] maps a pod to the (status, message) its patch fails with."""
    from infertune.controller import pods as controller_pods
    written: list[tuple[str, Any, Any]] = []
    controller["patch_errors"] = {}
    controller["backfilled"] = []

    controller["asked"] = []

    def patch(namespace: str, pod: str, metadata: dict[str, Any]) -> None:
        if "infertune.io/revision" in metadata["labels"]:
            controller["asked"].append(pod)
        if pod in controller["patch_errors"]:
            status, said = controller["patch_errors"][pod]
            error = ApiException(status=status, reason="Refused")
            error.body = json.dumps({"kind": "Status", "message": said})
            raise error
        if "infertune.io/shape" in metadata["labels"]:  # a backfill
            assert list(metadata["labels"]) == ["infertune.io/shape"], metadata
            controller["backfilled"].append((pod, metadata["labels"]["infertune.io/shape"], (
                metadata.get("annotations") or {}).get("infertune.io/serving-container")))
            return
        assert set(metadata) == {"labels", "annotations"}, metadata
        assert list(metadata["labels"]) == ["infertune.io/revision"]
        assert list(metadata["annotations"]) == ["infertune.io/memory-high"]
        written.append((pod, metadata["labels"]["infertune.io/revision"],
                        metadata["annotations"]["infertune.io/memory-high"]))

    monkeypatch.setattr(controller_pods, "_patch_pod_metadata", patch)
    return written


def test_a_memory_change_is_written_on_the_running_pods_not_by_re_creating_them(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """memory.high is an intent in an annotation (the node agent writes it into the live
    cgroup): a change of spec.memory re-created every pod, a model load each, for it."""
    from infertune.tuning.pod_patch import tuning_revision
    pods = _tuned(controller, "a", "b", memory_high=str(15 * 2**30))
    _with_memory(controller, {"high": "14Gi"})
    revision = tuning_revision(controller["spec"])
    assert pods[0].revision != revision  # memory is in the revision: the pods are of another
    message = controller["run"](pods)
    assert controller["evicted"] == [] and controller["annotations"] == []
    assert patched == [("a", revision, str(14 * 2**30)), ("b", revision, str(14 * 2**30))]
    assert f"all 2 pods carry revision {revision}" in message
    assert "memory.high intent updated in place on 2 pods" in message
    [(kind, reason, said)] = controller["events"]
    assert (kind, reason) == ("Normal", "MemoryHighUpdated")
    assert said.endswith(f"14.00Gi ({14 * 2**30} bytes) on a, b"), said
    # A pod that carries the value already (the same value from another spec): the label
    # alone, and nothing said.
    patched.clear()
    pods = _tuned(controller, "c", memory_high=str(14 * 2**30))  # of the 14Gi spec
    _with_memory(controller, {"highRatio": 0.875})  # 14Gi of the 16Gi limit
    message = controller["run"](pods)
    assert patched == [("c", tuning_revision(controller["spec"]), str(14 * 2**30))]
    assert "in place" not in message and len(controller["events"]) == 1


def test_the_intent_follows_the_container_the_webhook_tuned(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """A service mesh's webhook, after this one, puts its proxy first in the stored pod: the
    first container is not the one tuned. A ratio of the limit gives each pod its own value
    (pods of an older template have another limit)."""
    pods = [*_tuned(controller, "a"),
            *_tuned(controller, "b", memory=(("proxy", "1Gi", "1Gi"), ("tgi", "4Gi", "10Gi")))]
    _with_memory(controller, {"highRatio": 0.9})
    controller["run"](pods)
    # 0.9 of each serving container's limit, in whole pages.
    assert [(p, v) for p, _, v in patched] == [
        ("a", str(int(0.9 * 16 * 2**30) // 4096 * 4096)),
        ("b", str(int(0.9 * 10 * 2**30) // 4096 * 4096))]


def test_pods_of_another_shape_or_not_known_are_re_created_as_before(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """Another shape (numa, allocator, ...) needs a new pod; a pod from a release before the
    shape label, or without the serving container's name, is not known to differ in memory
    only; a terminating pod is left."""
    controller["replicas"] = 3
    tuned, unnamed = _tuned(controller, "a")[0], _tuned(controller, "unnamed", serving=None)[0]
    _with_memory(controller, {"high": "14Gi"})
    old = PodView("old", tuned.revision, True, memory=TGI, serving="tgi")  # no shape label
    other = replace(tuned, name="other", shape="0123456789")  # of another numa, allocator...
    message = controller["run"]([old, unnamed, other])
    assert patched == [] and "3 pods outdated" in message
    assert controller["evicted"] == ["old"]
    controller["run"]([PodView("going", tuned.revision, False, True, shape=tuned.shape,
                               serving="tgi", memory=TGI)])
    assert patched == []


def test_a_memory_spec_the_pods_cannot_take_leaves_them_outdated_and_running(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """Above the limit less minHeadroom the webhook admits a pod untuned. Where the template
    gives the serving container no memory limit (a LimitRange's default gives the pods
    theirs), the template's preview cannot tell: the pods' own limit does, and they keep the
    tuning they have (a replacement would come back with no binding and no allocator). Said
    once, however many passes it lasts."""
    serving = controller["deployment"]["spec"]["template"]["spec"]["containers"][0]
    template_resources = serving["resources"]
    serving["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    pods = _tuned(controller, "a", "b")
    _with_memory(controller, {"high": "15Gi"})
    stored = [replace(p, memory=(("tgi", "12Gi", "14Gi"),)) for p in pods]  # the default's
    controller["memo"].pod_tuning.latest_problems["chat/mistral-7b"] = []  # admitted clean
    for _ in range(3):
        message = controller["run"](stored)
    assert patched == [] and controller["evicted"] == []
    assert message.startswith(
        "2 pods outdated, none replaced: they keep the tuning they have; the running pods "
        "cannot take the new spec.memory, and a replacement (with the same default memory "
        "limit) would be admitted untuned: spec.memory.high: 15Gi is above the memory limit "
        "14Gi"), message
    [(kind, reason, _)] = controller["events"]
    assert (kind, reason) == ("Warning", "PodNotTuned")
    # The template sets a limit (the same edit raised it: a rollout brings it): it is right.
    serving["resources"] = {**template_resources,
                            "limits": {**template_resources["limits"], "memory": "20Gi"}}
    controller["replicas"] = 2
    controller["run"](stored)
    assert controller["evicted"] == ["a"]


def test_a_partial_memory_spec_removes_the_intent_and_says_why(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """Under half the limit of a container that requests its whole limit, memory.high stays
    at max and the rest of the tuning is kept, as the webhook admits such a pod, and in its
    words: said once for all the pods."""
    pods = _tuned(controller, "a", "b", memory=(("tgi", "16Gi", "16Gi"),), memory_high="1")
    _with_memory(controller, {"high": "4Gi"})
    status = controller_status(controller, pods)
    assert [(p, v) for p, _, v in patched] == [("a", None), ("b", None)]
    [warning] = [e for e in controller["events"] if e[0] == "Warning"]
    said = ("spec.memory.high: 4Gi is under half the memory limit 16Gi, which the container "
            "requests whole")
    assert warning[1] == "PodPartlyTuned" and warning[2].startswith(said), warning
    assert warning[2].endswith("memory.high stays at max, and the rest of the tuning is "
                               "applied")
    assert [p for p in status.problems if p.startswith(said)] == [warning[2]]
    assert status.outdated_pods == 0


def test_a_burstable_memory_high_under_half_the_limit_is_written_and_said(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """A Burstable container takes a memory.high above its request; under half its limit it
    is written in place and said, in the webhook's words."""
    pods = _tuned(controller, "a", memory=(("tgi", "1Gi", "16Gi"),), memory_high="1")
    _with_memory(controller, {"high": "4Gi"})
    status = controller_status(controller, pods)
    assert [(p, v) for p, _, v in patched] == [("a", str(4 * 2**30))]
    said = "spec.memory.high: 4Gi is under half the memory limit 16Gi: the container is"
    assert [p for p in status.problems if p.startswith(said)], status.problems


def test_what_the_last_pod_was_told_of_memory_goes_with_the_change(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """No pod is admitted after an in-place change: the problems of the last admission about
    spec.memory were said of the spec before it (status.tuning.problems kept them), and a
    change back to that spec is not taken for it."""
    memo, key = controller["memo"], "chat/mistral-7b"
    pods = _tuned(controller, "a", memory=(("tgi", "16Gi", "16Gi"),))
    other = "container x has no cpu limit"
    memo.pod_tuning.latest_problems[key] = [other]
    memo.pod_tuning.problems_revision[key] = pods[0].revision
    first = controller["spec"]
    _with_memory(controller, {"high": "4Gi"})  # under half: memory.high stays at max
    status = controller_status(controller, pods)
    assert status.problems[0] == other and len(status.problems) == 2
    assert status.problems[1].startswith("spec.memory.high: 4Gi is under half")
    # Back to the first spec: the pods (now of the 4Gi revision) take it in place again.
    back = [replace(p, revision=status.revision) for p in pods]
    controller["spec"] = first
    assert controller_status(controller, back).problems == [other]
    # A pod admitted by the webhook since the change: what it was told stands.
    memo.pod_tuning.latest_problems[key] = [other, "spec.memory.high: told at admission"]
    memo.pod_tuning.problems_revision[key] = status.revision
    _with_memory(controller, {"high": "4Gi"})
    patched.clear()
    assert controller_status(controller, pods).problems == [
        other, "spec.memory.high: told at admission"]
    assert patched  # taken in place all the same


def test_nothing_is_patched_with_rivals_or_by_a_process_that_does_not_lead(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    pods = _tuned(controller, "a")
    _with_memory(controller, {"high": "14Gi"})
    controller["run"](pods, rivals=("mistral-7b-v2",))
    assert patched == []

    controller["memo"]["leader"] = LostLease()
    assert "it no longer leads" in controller["run"](pods)
    assert patched == [] and controller["evicted"] == []
    del controller["memo"]["leader"]


def test_a_pod_whose_patch_is_refused_stays_outdated_and_is_replaced(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """A policy's refusal of one pod (422, or a 403 from a policy webhook) lets the others be
    updated, and that pod is replaced as before; a 403 of RBAC (no patch on pods: an operator
    upgraded without its chart's RBAC) says what the operator needs, once for all."""
    pods = _tuned(controller, "a", "b", "c")
    _with_memory(controller, {"high": "14Gi"})
    controller["patch_errors"] = {"a": (422, "denied by policy require-labels"),
                                  "b": (403, "admission webhook \"gatekeeper\" denied")}
    message = controller["run"](pods)
    assert [p for p, _, _ in patched] == ["c"]
    assert "2 pods outdated; evicting a" in message, message
    assert ("pods could not take spec.memory in place, and stay outdated: a: 422 "
            "Refused: denied by policy require-labels; b: 403") in message, message
    warning = [e for e in controller["events"] if e[1] == "MemoryHighNotUpdated"]
    assert len(warning) == 1 and warning[0][0] == "Warning"
    patched.clear()
    rbac = ('pods "a" is forbidden: User "system:serviceaccount:infertune-system:infertune" '
            'cannot patch resource "pods" in API group "" in the namespace "chat"')
    controller["patch_errors"] = {"a": (403, rbac), "b": (403, rbac)}
    _with_memory(controller, {"high": "13Gi"})  # another spec: the refused are asked at once
    message = controller["run"](pods)
    assert [p for p, _, _ in patched] == [], "stopped at the first: the same for every pod"
    assert ("pods could not take spec.memory in place, and stay outdated: the operator "
            "may not patch pods in namespace chat (403): it needs patch on pods, which the "
            "chart's RBAC grants") in message and message.count("403") == 1, message


def _clock(monkeypatch: pytest.MonkeyPatch, start: float = 1000.0) -> list[float]:
    """The monotonic clock of pods.retune, set by the test (clock[0])."""
    from infertune.controller import pods as controller_pods
    clock = [start]
    monkeypatch.setattr(controller_pods, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    return clock


def test_a_refused_pod_is_asked_again_later_not_at_every_pass(
        controller: Any, patched: list[tuple[str, Any, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod that a policy refuses (held by PodTemplateAnnotation, it stays until fixed or
    deleted) cost a PATCH every 10 s pass: asked again after 30 s, then after twice as long
    at each refusal, up to 5 minutes; at once after a change of the spec; a server error at
    the next pass. What status and the Event say is the same meanwhile."""
    from infertune.controller.pods import IN_PLACE_RETRIED, IN_PLACE_RETRY_MAX_S
    clock = _clock(monkeypatch)
    controller["spec"] = controller["spec"].model_copy(update={
        "retune": controller["spec"].retune.model_copy(update={
            "strategy": RetuneStrategy.POD_TEMPLATE_ANNOTATION})})
    pods = _tuned(controller, "a", "b")
    _with_memory(controller, {"high": "14Gi"})
    controller["patch_errors"] = {"a": (422, "denied by policy require-labels")}
    first = controller["run"](pods)
    assert controller["asked"] == ["a", "b"]
    assert first.endswith(f"denied by policy require-labels ({IN_PLACE_RETRIED})"), first
    current = [pods[0], replace(pods[1], revision=patched[0][1])]
    steady = first.replace("memory.high intent updated in place on 1 pods; ", "")
    asks: list[float] = []
    for _ in range(80):  # 800 s of passes, 10 s apart
        clock[0] += 10
        controller["asked"].clear()
        assert controller["run"](current) == steady
        if controller["asked"]:
            assert controller["asked"] == ["a"]
            asks.append(clock[0])
    assert asks[:4] == [1030, 1090, 1210, 1450], asks  # 30, 60, 120, 240 s after
    assert [b - a for a, b in pairwise(asks[3:])] == [
        IN_PLACE_RETRY_MAX_S] * (len(asks) - 4)
    assert [e[1] for e in controller["events"]] == ["MemoryHighUpdated",
                                                    "MemoryHighNotUpdated"]
    # Fixed: taken at the next ask, within the longest wait.
    controller["patch_errors"] = {}
    while not controller["asked"]:
        clock[0] += 10
        controller["run"](current)
    assert [p for p, _, _ in patched] == ["b", "a"]
    # A change of the spec asks at once; a server error asks again at the next pass.
    pods = _tuned(controller, "a", "b")
    _with_memory(controller, {"high": "13Gi"})
    controller["patch_errors"] = {"a": (422, "denied")}
    controller["run"](pods)
    _with_memory(controller, {"high": "12Gi"})
    controller["asked"].clear()
    controller["patch_errors"] = {"a": (503, "etcdserver: leader changed")}
    message = controller["run"](pods)
    assert controller["asked"] == ["a", "b"] and IN_PLACE_RETRIED not in message, message
    clock[0] += 10
    controller["asked"].clear()
    controller["run"](pods)  # b was written: as the index shows it still, it is not again
    assert controller["asked"] == ["a"]
    # Without patch on pods (RBAC), none is asked again before the wait either.
    rbac = 'User "system:serviceaccount:x:y" cannot patch resource "pods" in API group ""'
    controller["patch_errors"] = {"a": (403, rbac), "b": (403, rbac)}
    _with_memory(controller, {"high": "12800Mi"})
    controller["asked"].clear()
    controller["run"](pods)
    clock[0] += 10
    message = controller["run"](pods)
    assert controller["asked"] == ["a"] and message.count("403") == 1, message
    clock[0] += 30
    controller["run"](pods)
    assert controller["asked"] == ["a", "a"]


def test_a_pod_written_in_place_is_not_written_again_while_the_index_lags(
        controller: Any, patched: list[tuple[str, Any, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's pod index learns of the patch from the watch: a pass before it does saw the pod
    as it was, patched it again and posted a second MemoryHighUpdated Event. It counts as
    written for a minute; past that, what the index shows is taken (a label someone changed
    back is written again)."""
    clock = _clock(monkeypatch)
    pods = _tuned(controller, "a", "b")
    _with_memory(controller, {"high": "14Gi"})
    controller["run"](pods)
    assert controller["asked"] == ["a", "b"]
    clock[0] += 10
    controller["asked"].clear()
    status = controller_status(controller, pods)  # the index as it was
    assert controller["asked"] == [] and status.outdated_pods == 0, status.message
    assert [e[1] for e in controller["events"]] == ["MemoryHighUpdated"]
    clock[0] += 60
    controller["run"](pods)
    assert controller["asked"] == ["a", "b"]


def test_a_refusal_of_rbac_leaves_alone_the_pods_written_or_waiting(
        controller: Any, patched: list[tuple[str, Any, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """RBAC's 403 stops the pass and holds the pods not asked: not one written at a pass
    before (the index not caught up: it carries the revision), and not one already waiting,
    whose wait is kept (doubled, it was asked later than it should). A server error after a
    refusal is asked again at the next pass, and not said to wait."""
    from infertune.controller.pods import IN_PLACE_RETRIED
    clock = _clock(monkeypatch)
    pods = _tuned(controller, "a", "b", "c")
    _with_memory(controller, {"high": "14Gi"})
    controller["patch_errors"] = {"a": (503, "etcdserver: leader changed"),
                                  "c": (422, "denied by policy require-labels")}
    controller["run"](pods)
    assert [p for p, _, _ in patched] == ["b"]
    clock[0] += 10
    rbac = 'User "system:serviceaccount:x:y" cannot patch resource "pods" in API group ""'
    controller["patch_errors"] = {"a": (403, rbac), "c": (422, "denied")}
    controller["asked"].clear()
    status = controller_status(controller, pods)
    assert controller["asked"] == ["a"] and status.outdated_pods == 2, status.message
    controller["patch_errors"] = {"a": (503, "etcdserver: leader changed"),
                                  "c": (503, "etcdserver: leader changed")}
    clock[0] += 20  # c's first wait (30 s) is over; a's (RBAC, 30 s from the last pass) not
    controller["asked"].clear()
    message = controller["run"](pods)
    assert controller["asked"] == ["c"], controller["asked"]
    assert IN_PLACE_RETRIED in message  # a waits still
    clock[0] += 10
    controller["asked"].clear()
    message = controller["run"](pods)
    assert controller["asked"] == ["a", "c"], controller["asked"]
    assert IN_PLACE_RETRIED not in message, message  # server errors: the next pass


def _retune_loop(controller: Any, monkeypatch: pytest.MonkeyPatch, uid: str,
                 loop: Any = None) -> None:
    """The re-tuning daemon of the controller's tuning with `uid`, from its start to its stop,
    its loop (loops.every) replaced by `loop` (by default, stopped by kopf at once)."""
    import asyncio
    import logging

    import kopf

    from infertune.controller import pods as controller_pods

    async def stops(*_: Any, **__: Any) -> None:
        return None

    monkeypatch.setattr(controller_pods, "every", loop or stops)
    asyncio.run(controller_pods.retune_pods(
        stopped=None, namespace="chat", name="mistral-7b", uid=uid, body=kopf.Body({}),
        memo=controller["memo"], logger=logging.getLogger("test"), pods_by_deployment={},
        tunings_by_target={}))


def test_a_pass_that_ends_after_its_tuning_was_deleted_keeps_nothing(
        controller: Any, patched: list[tuple[str, Any, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's `finally` forgets the tuning when kopf stops it, while a pass may still run
    in its worker thread: what that pass kept afterwards (a refused pod's wait, an Event
    taken as said) was inherited by a tuning made again under the same name."""
    memo, key = controller["memo"], "chat/mistral-7b"
    pods = _tuned(controller, "a")
    _with_memory(controller, {"high": "14Gi"})
    controller["patch_errors"] = {"a": (422, "denied by policy require-labels")}
    controller["run"](pods)
    assert memo.pod_tuning.refused_in_place[key] and key + "#MemoryHighNotUpdated" in (
        memo.pod_tuning.reported)

    _retune_loop(controller, monkeypatch, "uid-1")  # stopped by kopf
    assert key not in memo.pod_tuning.refused_in_place
    controller["run"](pods)  # the pass that was still in its thread
    tables = (memo.pod_tuning.refused_in_place, memo.pod_tuning.written_in_place,
              memo.pod_tuning.latest_problems)
    assert all(key not in t for t in tables)
    assert not [k for k in memo.pod_tuning.reported if k.startswith(key)]
    # Started again for the same tuning (kopf resumes a daemon it stopped): kept again.
    started: list[bool] = []

    async def runs(*_: Any, **__: Any) -> None:
        started.append(True)
        controller["run"](pods)
        assert key in memo.pod_tuning.refused_in_place

    _retune_loop(controller, monkeypatch, "uid-1", runs)
    assert started == [True]


def test_a_late_pass_of_a_deleted_tuning_leaves_the_new_ones_state_alone(
        controller: Any, patched: list[tuple[str, Any, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleted and made again under its name (kubectl replace --force): the new tuning (another
    uid) has its loop and what its webhook admissions found, and the old tuning's pass still
    in its thread forgot it all when it ended (a PodNotTuned Event never posted, the guard
    against untuned replacements gone)."""
    from infertune.controller import pods as controller_pods
    memo, key = controller["memo"], "chat/mistral-7b"
    _retune_loop(controller, monkeypatch, "uid-1")  # the old one's loop stopped: deleted
    problem = ("spec.memory.high: told at admission",)

    async def new_one_runs(*_: Any, **__: Any) -> None:
        memo.pod_tuning.unreported[key] = (problem, True)  # its webhook's admission
        memo.pod_tuning.problems_revision[key] = "r2"
        # The old pass ends now, in its thread.
        controller_pods.retune("chat", "mistral-7b", "uid-1", controller["spec"],
                               _tuned(controller, "a"), memo)

    _retune_loop(controller, monkeypatch, "uid-2", new_one_runs)
    assert memo.pod_tuning.problems_revision == {}  # the new loop stopped too, and forgot it
    # Once more, with the new loop still running when the old pass ends.
    kept: list[Any] = []

    async def still_runs(*_: Any, **__: Any) -> None:
        await new_one_runs()
        kept.append(memo.pod_tuning.problems_revision.get(key))

    _retune_loop(controller, monkeypatch, "uid-2", still_runs)
    assert kept == ["r2"]


def test_pods_that_failed_in_place_do_not_roll_the_whole_deployment(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """With PodTemplateAnnotation, annotating the template for one refused pod would roll
    every pod, those just updated in place too."""
    controller["spec"] = controller["spec"].model_copy(update={
        "retune": controller["spec"].retune.model_copy(update={"strategy":
                                                               RetuneStrategy.POD_TEMPLATE_ANNOTATION})})
    controller["strategy"] = {"type": "RollingUpdate",
                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pods = _tuned(controller, "a", "b")
    _with_memory(controller, {"high": "14Gi"})
    controller["patch_errors"] = {"a": (422, "denied by policy require-labels")}
    message = controller["run"](pods)
    assert [p for p, _, _ in patched] == ["b"] and controller["annotations"] == []
    assert "1 pods outdated, none replaced: they could not take spec.memory in place" in message
    # A pod outdated for another reason is rolled out as before.
    patched.clear()
    message = controller["run"]([*pods, PodView("old", "r0", True)])
    assert controller["annotations"] != [], message
    # A pod gone before its patch (404), which the index still lists, is no pod to roll
    # the Deployment for either; without patch on pods (RBAC) none is current, and the
    # template is annotated as before.
    controller["annotations"].clear()
    controller["template_revision"] = None
    pods = _tuned(controller, "a", "b", "gone")
    _with_memory(controller, {"high": "13Gi"})
    controller["patch_errors"] = {"a": (422, "denied"), "gone": (404, "not found")}
    message = controller["run"](pods)
    assert controller["annotations"] == [], message
    assert message.startswith("1 pods outdated, none replaced: they could not take"), message
    controller["annotations"].clear()
    controller["template_revision"] = None
    rbac = 'User "system:serviceaccount:x:y" cannot patch resource "pods" in API group ""'
    controller["patch_errors"] = {"a": (403, rbac), "b": (403, rbac)}
    _with_memory(controller, {"high": "12Gi"})
    message = controller["run"](pods[:2])
    assert controller["annotations"] != [], message


def test_a_template_rolling_out_the_revision_is_said_as_any_rollout(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """Without patch on pods the template was annotated, and the Deployment rolls the pods
    out: its first new pods are current, the old ones refused. What the rollout does is said
    (paused: resume it), not a hold; once it has rolled out (a change back: the template
    carried the revision already), the refused pods are held, said so."""
    from infertune.tuning.pod_patch import tuning_revision
    _by_template(controller)
    rbac = 'User "system:serviceaccount:x:y" cannot patch resource "pods" in API group ""'
    old = _tuned(controller, "a", "b")
    _with_memory(controller, {"high": "14Gi"})
    controller["patch_errors"] = {"a": (403, rbac), "b": (403, rbac), "c": (403, rbac)}
    controller["template_revision"] = tuning_revision(controller["spec"])
    pods = [*old, *_tuned(controller, "new")]  # of the revision: the rollout's
    controller["status"] = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 1}
    assert "the Deployment rolls them out" in controller["run"](pods)
    controller["paused"] = True
    assert "is paused: resume it" in controller["run"](pods)
    controller["paused"] = False
    controller["status"] = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3,
                            "availableReplicas": 3}
    assert "none replaced: they could not take spec.memory in place" in controller["run"](pods)
    # RBAC stops at the first pod: the ones not tried are refused all the same.
    controller["template_revision"] = None
    controller["status"] = None
    message = controller["run"](pods)
    assert "none replaced: they could not take" in message and controller["annotations"] == []


def test_pods_tuned_before_the_shape_label_are_labelled_once(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """Of the revision, they were tuned by the spec as it is: labelled with its shape (and
    their serving container named where the stored pod tells it), a later change of
    spec.memory is taken by them in place instead of re-creating them."""
    from infertune.tuning.pod_patch import shape_revision, tuning_revision
    revision, shape = tuning_revision(controller["spec"]), shape_revision(controller["spec"])
    pods = [PodView("one", revision, True, memory=TGI),
            PodView("meshed", revision, True, memory=(("proxy", None, None), *TGI)),
            PodView("old", "r0", True, memory=TGI),
            PodView("going", revision, False, True, memory=TGI)]
    message = controller["run"](pods)
    assert controller["backfilled"] == [("one", shape, "tgi"), ("meshed", shape, None)]
    assert patched == [] and message.startswith("1 pods outdated"), message
    controller["run"](pods)  # once: refused by an older policy, it is not asked again
    assert len(controller["backfilled"]) == 2
    # spec.container names it in a pod of several.
    controller["backfilled"].clear()
    controller["spec"] = controller["spec"].model_copy(update={"container": "tgi"})
    revision = tuning_revision(controller["spec"])
    controller["run"]([PodView("named", revision, True,
                               memory=(("proxy", None, None), *TGI))])
    assert controller["backfilled"] == [("named", shape_revision(controller["spec"]), "tgi")]
    # Not with rivals.
    controller["backfilled"].clear()
    controller["run"]([PodView("rival", revision, True, memory=TGI)],
                      rivals=("mistral-7b-v2",))
    assert controller["backfilled"] == []
    # A server error is asked again at the next pass; a refusal (an older policy) is not.
    controller["patch_errors"] = {"busy": (500, "etcdserver: timeout"),
                                  "refused": (403, "denied by policy")}
    pods = [PodView(n, revision, True, memory=TGI) for n in ("busy", "refused")]
    controller["run"](pods)
    controller["patch_errors"] = {}
    controller["run"](pods)
    assert [p for p, _, _ in controller["backfilled"]] == ["busy"]


def test_nothing_is_patched_in_a_namespace_the_webhook_leaves_out(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    pods = _tuned(controller, "a")
    _with_memory(controller, {"high": "14Gi"})
    controller["run"](pods, namespace="kube-system")
    assert patched == []


def test_what_failed_in_place_is_said_again_after_a_pass_without_failures(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """And a pass where every patch failed changes nothing of what status says."""
    memo, key = controller["memo"], "chat/mistral-7b"
    pods = _tuned(controller, "a")
    admitted = ["spec.memory.high: as the pods were admitted", "another problem"]
    memo.pod_tuning.latest_problems[key] = admitted
    memo.pod_tuning.problems_revision[key] = pods[0].revision
    _with_memory(controller, {"high": "14Gi"})
    controller["patch_errors"] = {"a": (422, "denied")}
    status = controller_status(controller, pods)
    assert status.problems == admitted  # the pod is replaced, and admitted again
    assert [e[1] for e in controller["events"]] == ["MemoryHighNotUpdated"]
    controller["patch_errors"] = {}
    controller_status(controller, _tuned(controller, "b"))  # current: nothing to patch
    controller["patch_errors"] = {"a": (422, "denied")}
    controller_status(controller, pods)
    assert [e[1] for e in controller["events"]] == ["MemoryHighNotUpdated"] * 2
    # Nothing written: what the spec leaves undone on them is not said of pods it is not on.
    _with_memory(controller, {"high": "4Gi"})
    controller_status(controller, [replace(pods[0], memory=(("tgi", "16Gi", "16Gi"),))])
    assert "PodPartlyTuned" not in [e[1] for e in controller["events"]]


def test_an_untuned_replacement_is_said_once_with_the_webhooks_report(controller: Any) -> None:
    """The webhook admitted the last pod untuned, and re-tuning holds the outdated ones for
    the same reason: one PodNotTuned Event, not one from each."""
    from infertune.tuning.pod_patch import tuning_revision
    memo, key = controller["memo"], "chat/mistral-7b"
    why = "spec.memory.high: 15Gi is above the memory limit 14Gi minus minHeadroom 1Gi"
    untuned = PodView("mistral-7b-6b7c9d-new", None, True, created=2000.0,
                      untuned=f"{tuning_revision(controller['spec'])}: {why}")
    memo.pod_tuning.unreported[key] = ((why,), True)
    memo.pod_tuning.latest_problems[key] = [why]
    for _ in range(2):
        message = controller["run"]([*_outdated(3), untuned])
    assert message == f"4 pods not tuned, none replaced: {why}"
    assert [e[1] for e in controller["events"]] == ["PodNotTuned"]


def test_a_pod_another_process_admitted_untuned_holds_the_replacements(
        controller: Any) -> None:
    """Any operator process's webhook may admit a pod, and only the leader re-tunes: the
    verdict the follower kept in memory never reached it, which evicted pod after pod that
    came back untuned. The pod says it now (infertune.io/untuned), and the newest pod of the
    revision decides."""
    from infertune.tuning.pod_patch import tuning_revision
    revision = tuning_revision(controller["spec"])
    why = "LimitRange tight allows at most 5m cpu per container, and the launcher needs 10m"
    untuned = replace(_outdated(1)[0], name="mistral-7b-6b7c9d-new", untuned=f"{revision}: {why}",
                      created=2000.0)
    message = controller["run"]([*_outdated(3), untuned])
    assert controller["evicted"] == [], message
    assert message == f"4 pods not tuned, none replaced: {why}"
    assert [e[1] for e in controller["events"]] == ["PodNotTuned"]
    # A pod of an older revision says nothing of this one; a newer pod of it, tuned, is the
    # newest word: the webhook tunes them now.
    stale = replace(untuned, untuned=f"0123456789: {why}")
    message = controller["run"]([*_outdated(3), stale])
    assert controller["evicted"] == ["mistral-7b-6b7c9d-00000"], message
    controller["evicted"].clear()
    controller["memo"].pod_tuning.last_evictions.clear()  # that eviction's wait is over
    tuned = replace(_tuned(controller, "mistral-7b-6b7c9d-newer")[0], created=3000.0)
    message = controller["run"]([*_outdated(2), untuned, tuned])
    assert controller["evicted"] == ["mistral-7b-6b7c9d-00000"], message


def test_the_newest_pod_of_a_revision_is_the_webhooks_last_word() -> None:
    from infertune.controller.pods import admitted_untuned
    old = PodView("a", None, True, untuned="r1: too small", created=10.0)
    tuned = PodView("b", "r1", True, created=20.0)
    gone = PodView("c", None, True, terminating=True, untuned="r1: later", created=30.0)
    assert admitted_untuned([old], "r1") == ("r1", "too small")
    assert admitted_untuned([old, tuned, gone], "r1") == ("r1", None)
    assert admitted_untuned([replace(tuned, created=5.0), old], "r1") == ("r1", "too small")
    assert admitted_untuned([old], "r2") is None


def test_a_pod_gone_before_its_patch_is_not_said_to_fail(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    pods = _tuned(controller, "gone", "b")
    _with_memory(controller, {"high": "14Gi"})
    controller["patch_errors"] = {"gone": (404, "pods \"gone\" not found")}
    message = controller["run"](pods)
    assert [p for p, _, _ in patched] == ["b"] and "could not" not in message


def test_the_value_in_place_is_what_the_webhook_gives_the_pod(
        controller: Any, patched: list[tuple[str, Any, Any]]) -> None:
    """The planner tunes a pod; a proxy is put first after it (a later webhook); the pod is
    indexed as stored; spec.memory changes: re-tuning writes what the planner gives the
    same pod under the new spec."""
    import asyncio

    from infertune.controller.pods import pods_by_deployment
    from infertune.tuning.pod_patch import PodContext, plan_pod_patch
    pod = {"metadata": {"name": "mistral-7b-6b7c9d-abcde", "namespace": "chat",
                        "ownerReferences": [{"kind": "ReplicaSet", "name": "mistral-7b-6b7c9d",
                                             "controller": True}]},
           "spec": {"containers": [{"name": "tgi", "image": "tgi:3", "command": ["serve"],
                                    "resources": {"requests": {"memory": "6Gi", "cpu": "4"},
                                                  "limits": {"memory": "10Gi", "cpu": "4",
                                                             "nvidia.com/gpu": "1"}}}]}}
    context = PodContext(tuning_name="mistral-7b", launcher_image="l:1")

    def tuned(spec: InferenceTuningSpec) -> dict[str, Any]:
        import jsonpatch  # type: ignore[import-untyped]
        return jsonpatch.apply_patch(pod, plan_pod_patch(spec, pod, context).patch)

    before = tuned(controller["spec"])
    before["spec"]["containers"].insert(0, {"name": "istio-proxy", "resources": {
        "requests": {"memory": "128Mi"}, "limits": {"memory": "1Gi"}}})
    before["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    indexed = asyncio.run(pods_by_deployment(namespace="chat", name=before["metadata"]["name"],
                                             body=before, replicaset_owners=OWNED))
    assert indexed is not None
    refused = 0
    for memory in ({"highRatio": 0.85}, {"high": "7Gi"}, {"minHeadroom": "3Gi"},
                   {"high": "9500Mi"}):
        patched.clear()
        _with_memory(controller, memory)
        controller["run"](list(indexed.values()))
        if plan_pod_patch(controller["spec"], pod, context).refused:  # 9500Mi: above 10Gi-1Gi
            assert patched == [], memory
            refused += 1
            continue
        after = tuned(controller["spec"])
        assert [(p, v) for p, _, v in patched] == [
            (before["metadata"]["name"],
             after["metadata"]["annotations"].get("infertune.io/memory-high"))], memory
        assert patched[0][1] == after["metadata"]["labels"]["infertune.io/revision"]
    assert refused == 1


def controller_status(controller: Any, pods: list[PodView],
                      stored: dict[str, Any] | None = None) -> Any:
    from infertune.controller import pods as controller_pods
    return controller_pods.retune("chat", "mistral-7b", "uid-1", controller["spec"], pods,
                                  controller["memo"], stored=stored)


def test_a_restarted_operator_shows_the_problems_stored_for_the_revision(
        controller: Any, patched: list[tuple[str, Any, Any]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """status.tuning.problems are kept in the process: restarted (or a new leader), the
    operator showed none until a pod was admitted again, days later perhaps, and a memory
    problem found in place is told by no admission at all. Taken from the status the last
    pass stored, for the current revision only, without posting their Event again."""
    from infertune.tuning.pod_patch import tuning_revision
    revision = tuning_revision(controller["spec"])
    pods = _tuned(controller, "a")
    problems = ["spec.memory.high: 4Gi is under half the memory limit 16Gi", "another one"]
    stored = {"revision": revision, "problems": problems, "tunedPods": 1}
    assert controller_status(controller, pods, stored).problems == problems
    assert controller["events"] == []
    # The webhook's next admission says what holds now.
    memo, key = controller["memo"], "chat/mistral-7b"
    memo.pod_tuning.latest_problems[key] = []
    assert controller_status(controller, pods, stored).problems == []
    # Of another revision (the spec changed while the operator was down), or edited into
    # something that is not a list of texts: not taken.
    for other in ({**stored, "revision": "r0"}, {**stored, "problems": "a text"},
                  {**stored, "problems": [{"a": 1}, 2]}, None):
        memo.pod_tuning.forget(key)
        assert controller_status(controller, pods, other).problems == [], other
    memo.pod_tuning.forget(key)
    many = {**stored, "problems": [f"problem {i}" for i in range(30)]}
    assert len(controller_status(controller, pods, many).problems) == 20
    # Stored by a pass of this revision while a policy refused the pods' in-place patch: the
    # spec.memory line was the spec's before. Once a pod is written in place, its lines are
    # said anew (taken as this revision's, the old line stayed until a pod was admitted).
    memo.pod_tuning.forget(key)
    clock = _clock(monkeypatch)
    _with_memory(controller, {"high": "14Gi"})
    stored = {"revision": tuning_revision(controller["spec"]), "problems": problems}
    controller["patch_errors"] = {"a": (422, "denied by policy require-labels")}
    assert controller_status(controller, pods, stored).problems == problems
    controller["patch_errors"] = {}
    clock[0] += 30
    assert controller_status(controller, pods, stored).problems == ["another one"]
    assert [p for p, _, _ in patched] == ["a"]
