"""The replicas write and the status write of one evaluation are two calls: when the second
fails, or the answer to the first is lost, the next evaluation must still know the first
happened (its scale event in the rate limits, its count not taken for someone else's)."""

from __future__ import annotations

import copy
from typing import Any

import kopf
import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ReadTimeoutError

from infertune.api.spec import InferenceTuningSpec, Mode
from infertune.controller import autoscaling
from infertune.controller import fights as fights_module
from infertune.controller.autoscaling import OWN_SCALE_WRITE
from infertune.controller.fights import Writers
from infertune.controller.status_patch import merge_patch
from infertune.kube.client import DeploymentReplicas
from infertune.scaling.signals import Series, TargetSignals, Window
from infertune.scaling.state import format_time

T0 = 1_700_000_010.0
SPEC = InferenceTuningSpec.model_validate({
    "targetRef": {"name": "llm"}, "engine": "vllm",
    "autoscaling": {"minReplicas": 1, "maxReplicas": 50,
                    "scaleUp": {"pods": 1, "percent": 0, "period": "60s"}}})


NO_OTHER_WRITERS = Writers()


def busy(now: float) -> TargetSignals:
    """A queue twice the target, sustained: scale out, one pod per minute."""
    window = Window.of_points([(now - 30 + i, 64.0) for i in range(31)], now, 30.0, 1.0, 32.0)
    return TargetSignals(window, Series(((now - 15, 0.05), (now, 0.05)), 15.0),
                         Series(((now - 15, 10.0), (now, 10.0)), 15.0))


class Cluster:
    """The Deployment, the tuning's stored status and the Events, as the API calls see them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, replicas: int) -> None:
        self.replicas = replicas
        self.status: dict[str, Any] = {}
        self.events: list[str] = []
        self.messages: list[str] = []
        """The Events' messages, in the order of `events`."""
        self.status_fails = False
        self.owners: tuple[tuple[str, str], ...] = ()
        """Who owns spec.replicas in the Deployment's managedFields."""
        self.created: float | None = None
        """The Deployment's creationTimestamp."""
        self.scale_answer_lost = False
        self.scale_answer_error: ApiException | None = None
        """Raised after the replicas write lands (an API server that timed out on etcd)."""
        self.scale_refusal: ApiException | None = None
        """Raised instead of the replicas write, for as long as it is set."""
        cluster = self

        class Apps:
            def patch_namespaced_deployment_scale(self, name: str, namespace: str,
                                                  ops: list[dict[str, Any]]) -> None:
                if cluster.scale_refusal is not None:
                    raise cluster.scale_refusal
                assert ops[0]["value"] == cluster.replicas  # the test op holds
                cluster.replicas = ops[1]["value"]
                if cluster.scale_answer_lost:
                    cluster.scale_answer_lost = False
                    raise ReadTimeoutError(None, "/apis/apps/v1/...", "read timed out")
                if cluster.scale_answer_error is not None:
                    error, cluster.scale_answer_error = cluster.scale_answer_error, None
                    raise error

        class Tunings:
            def get_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
                return {"metadata": {"generation": 1}, "status": cluster.status}

        def write_status(namespace: str, name: str, status: Any, version: Any, build: Any,
                         still: Any = None) -> dict[str, Any]:
            patch = build(status)
            if cluster.status_fails:
                cluster.status_fails = False
                raise ApiException(status=500, reason="etcdserver: request timed out")
            cluster.status = merge_patch(cluster.status, copy.deepcopy(patch))
            return dict(patch)

        def event(_body: Any, *, type: str, reason: str, message: str) -> None:
            cluster.events.append(reason)
            cluster.messages.append(message)

        monkeypatch.setattr(autoscaling.client, "AppsV1Api", Apps)
        monkeypatch.setattr(autoscaling.client, "CustomObjectsApi", Tunings)
        monkeypatch.setattr(autoscaling, "deployment_replicas", lambda namespace, name:
                            DeploymentReplicas(cluster.replicas, cluster.replicas, {},
                                               cluster.owners, created=cluster.created))
        monkeypatch.setattr(autoscaling, "write_status", write_status)
        monkeypatch.setattr(kopf, "event", event)

    def evaluate(self, settings: autoscaling.AutoscalingSettings, now: float,
                 writers: Writers = NO_OTHER_WRITERS) -> int:
        decision = autoscaling.evaluate("ns", "t", 1, SPEC, copy.deepcopy(self.status),
                                        busy(now), settings, writers, {}, now, "1")
        return decision.desired_replicas


def test_a_failed_status_write_after_the_replicas_write_keeps_its_scale_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: no Event for the scale, and the next evaluation, deciding from a state without
    its scale event, added another pod 15 s later under "+1 pod per 60s"."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.status_fails = True
    with pytest.raises(ApiException):
        cluster.evaluate(settings, T0)
    assert cluster.replicas == 3 and cluster.events == ["ScaledOut"]
    assert cluster.status == {}  # the status write failed
    assert cluster.evaluate(settings, T0 + 15) == 3  # the period's +1 is spent
    assert cluster.replicas == 3
    stored = cluster.status["autoscaling"]
    assert [e["change"] for e in stored["state"]["scaleEvents"]] == [1]
    assert stored["writtenReplicas"] == 3 and stored.get("replicaFight") is None
    assert [d["action"] for d in cluster.status["decisions"]] == ["ScaleOut 2 -> 3"]
    assert cluster.evaluate(settings, T0 + 75) == 4  # the next period allows the next pod


def test_a_replicas_write_whose_answer_was_lost_is_still_ours(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The PATCH landed but its answer timed out: the write was not remembered, so the next
    evaluation took the new count for someone else's revert, and its scale event was not
    in the rate limits."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.scale_answer_lost = True
    assert cluster.evaluate(settings, T0) == 3
    assert cluster.replicas == 3 and cluster.events == ["ScaledOut"]
    assert cluster.status["autoscaling"]["writtenReplicas"] == 3
    assert cluster.evaluate(settings, T0 + 15) == 3
    assert cluster.status["autoscaling"].get("replicaFight") is None


@pytest.mark.parametrize(("status", "reason"), [
    (504, "Timeout: request did not complete within the allowed duration"),
    (500, "etcdserver: request timed out"),
])
def test_a_replicas_write_answered_with_a_server_error_that_landed_is_still_ours(
        monkeypatch: pytest.MonkeyPatch, status: int, reason: str) -> None:
    """The API server committed the write and then answered 504 (or 500 from an etcd
    timeout), which says nothing of whether it landed: reported as refused, with a Warning
    Event and no scale event, the next evaluation took the new count for a revert."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.scale_answer_error = ApiException(status=status, reason=reason)
    assert cluster.evaluate(settings, T0) == 3
    assert cluster.replicas == 3 and cluster.events == ["ScaledOut"]
    stored = cluster.status["autoscaling"]
    assert stored["writtenReplicas"] == 3
    assert [e["change"] for e in stored["state"]["scaleEvents"]] == [1]
    assert cluster.evaluate(settings, T0 + 15) == 3  # the period's +1 is spent
    assert cluster.status["autoscaling"].get("replicaFight") is None


def test_a_replicas_write_answered_with_a_server_error_that_did_not_land_is_not_applied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 503 before the write reached etcd: the replicas are as they were, so the decision
    is reported as not applied, with the server's message; as failed, not refused (a server
    error does not say whether the write will land)."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.scale_refusal = ApiException(status=503, reason="Service Unavailable")
    assert cluster.evaluate(settings, T0) == 3
    assert cluster.replicas == 2 and cluster.events == ["ScaleWriteFailed"]
    assert cluster.status["autoscaling"].get("writtenReplicas") is None
    assert cluster.status["decisions"][-1]["applied"] is False
    active = _scaling_active(cluster)
    assert (active["status"], active["reason"]) == ("False", "ScaleWriteFailed")
    assert active["message"] == (
        "writing 3 replicas to deployments/scale of llm failed (503): Service Unavailable; a "
        "server error does not say whether it landed, and the next evaluation reads the "
        "Deployment again")


def _scaling_active(cluster: Cluster) -> dict[str, Any]:
    return next(c for c in cluster.status["conditions"] if c["type"] == "ScalingActive")


def _steady(now: float) -> TargetSignals:
    """A queue at its target: Hold."""
    window = Window.of_points([(now - 30 + i, 32.0) for i in range(31)], now, 30.0, 1.0, 32.0)
    return TargetSignals(window, Series(((now - 15, 0.05), (now, 0.05)), 15.0),
                         Series(((now - 15, 10.0), (now, 10.0)), 15.0))


TIMED_OUT = ApiException(status=504, reason="Timeout: request did not complete within the "
                         "allowed duration")
"""The API server's answer to a write it may still be processing."""


def _answered_without_storing(monkeypatch: pytest.MonkeyPatch, error: Exception) -> list[int]:
    """Replicas writes answered with `error` and not stored (yet): the counts asked, for the
    test to land later."""
    pending: list[int] = []

    class StillProcessing(autoscaling.client.AppsV1Api):  # type: ignore[misc, name-defined]
        def patch_namespaced_deployment_scale(self, name: str, namespace: str,
                                              ops: list[dict[str, Any]]) -> None:
            pending.append(ops[1]["value"])
            raise error

    monkeypatch.setattr(autoscaling.client, "AppsV1Api", StillProcessing)
    return pending


@pytest.mark.parametrize("answer", ["504", "timeout"])
def test_a_write_that_lands_after_its_read_back_is_still_ours(
        monkeypatch: pytest.MonkeyPatch, answer: str) -> None:
    """A 504 ("may still be processing"), or an answer lost, and the count not there when
    read again: it lands a moment later. The count remembered from before took it for
    another writer's revert (a replicaFight), and its scale event was missing from the
    rate limits: the next pod came 15 s later under "+1 pod per 60s"."""
    cluster = Cluster(monkeypatch, replicas=2)
    cluster.owners = (OWN_SCALE_WRITE,)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    apps = autoscaling.client.AppsV1Api
    lost = ReadTimeoutError(None, "/apis/apps/v1/...", "read timed out")  # type: ignore[arg-type]
    pending = _answered_without_storing(monkeypatch, TIMED_OUT if answer == "504" else lost)
    if answer == "504":
        cluster.evaluate(settings, T0 + 60)
        assert cluster.events[-1] == "ScaleWriteFailed"
    else:
        with pytest.raises(ReadTimeoutError):
            cluster.evaluate(settings, T0 + 60)
    monkeypatch.setattr(autoscaling.client, "AppsV1Api", apps)
    cluster.replicas = pending[0]  # it lands; managedFields name the operator's scale write
    assert cluster.evaluate(settings, T0 + 75) == 4 and cluster.replicas == 4
    stored = cluster.status["autoscaling"]
    assert stored.get("replicaFight") is None
    # Counted from when it was found (the first, at T0, is past the 60 s period).
    assert [(e["change"], e["time"]) for e in stored["state"]["scaleEvents"]] == [
        (1, format_time(T0 + 75))]
    assert cluster.evaluate(settings, T0 + 130) == 4  # the period's +1 is spent
    assert cluster.evaluate(settings, T0 + 140) == 5


def test_a_failed_write_is_reported_by_holds_for_ten_minutes_not_for_good(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One 503, then a healthy API server and a load that no longer calls for more: every
    Hold kept ScalingActive=False ScaleWriteFailed, a day later still, and alerts on it kept
    firing for an operator that writes fine. A refusal (RBAC, a policy) stays: it lasts."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.scale_refusal = ApiException(status=503, reason="Service Unavailable")
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 2
    cluster.scale_refusal = None

    def hold(now: float) -> str:
        autoscaling.evaluate("ns", "t", 1, SPEC, copy.deepcopy(cluster.status), _steady(now),
                             settings, Writers(), {}, now, "1")
        return str(_scaling_active(cluster)["reason"])

    assert hold(T0 + 15) == "ScaleWriteFailed"
    assert hold(T0 + 590) == "ScaleWriteFailed"
    assert hold(T0 + 615) == "Scaling"
    assert cluster.replicas == 2 and cluster.events == ["ScaleWriteFailed"]


def test_a_failed_write_after_another_false_reason_is_kept_from_its_own_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ScalingActive False for an hour already (evaluations failing on a degraded API
    server), then a write answered 503: the condition keeps the hour-old transition time,
    and timed from it the failure was forgotten at the next Hold, each later 503 news again."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.status = {"conditions": [{
        "type": "ScalingActive", "status": "False", "reason": "EvaluationFailed",
        "message": "evaluations keep failing", "observedGeneration": 1,
        "lastTransitionTime": format_time(T0 - 3600)}]}
    cluster.scale_refusal = ApiException(status=503, reason="Service Unavailable")
    cluster.evaluate(settings, T0)
    cluster.scale_refusal = None
    assert _scaling_active(cluster)["lastTransitionTime"] == format_time(T0 - 3600)
    autoscaling.evaluate("ns", "t", 1, SPEC, copy.deepcopy(cluster.status), _steady(T0 + 15),
                         settings, Writers(), {}, T0 + 15, "1")
    assert _scaling_active(cluster)["reason"] == "ScaleWriteFailed"


def test_a_refused_write_stays_reported_until_a_write_lands(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ScalingActive said Scaling again at the next Hold although RBAC still refused, and the
    next refused write was news again: a second Warning and decision record."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.scale_refusal = ApiException(status=403, reason="Forbidden")
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 2
    refused = _scaling_active(cluster)
    assert refused["reason"] == "ScaleWriteRefused" and cluster.events == ["ScaleWriteRefused"]
    autoscaling.evaluate("ns", "t", 1, SPEC, copy.deepcopy(cluster.status), _steady(T0 + 15),
                         settings, Writers(), {}, T0 + 15, "1")
    assert _scaling_active(cluster) == refused  # a Hold: the last write was still refused
    assert cluster.evaluate(settings, T0 + 30) == 3 and cluster.replicas == 2
    assert cluster.evaluate(settings, T0 + 45) == 3 and cluster.replicas == 2
    # Said for the attempt after the Hold (a new decision), not again for the same one.
    assert cluster.events == ["ScaleWriteRefused"] * 2
    assert [d["action"] for d in cluster.status["decisions"]] == ["ScaleOut 2 -> 3"] * 2
    assert _scaling_active(cluster) == refused
    autoscaling.evaluate("ns", "t", 1, SPEC, copy.deepcopy(cluster.status), _steady(T0 + 3600),
                         settings, Writers(), {}, T0 + 3600, "1")
    assert _scaling_active(cluster) == refused  # an hour of Holds later: still refused
    cluster.scale_refusal = None  # the RBAC is fixed: the next write lands
    assert cluster.evaluate(settings, T0 + 3615) == 3 and cluster.replicas == 3
    assert _scaling_active(cluster)["reason"] == "Scaling"



@pytest.mark.parametrize("answer", [
    ReadTimeoutError(None, "/apis/apps/v1/...", "read timed out"),
    ApiException(status=504, reason="Timeout: request did not complete"),
])
def test_a_replicas_write_of_unknown_outcome_whose_read_back_failed_is_still_ours(
        monkeypatch: pytest.MonkeyPatch, answer: Exception) -> None:
    """The write 3 -> 4 landed, its answer was lost, and the read-back failed too (an API
    server browning out): the pass failed with the process still remembering 3 as its
    write, so the next evaluation took the 4 for another writer's revert and decided
    without its scale event (+1 again within the period)."""
    cluster = Cluster(monkeypatch, replicas=2)
    cluster.owners = (OWN_SCALE_WRITE,)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    reads = 0

    def read_back_fails(namespace: str, name: str) -> DeploymentReplicas:
        nonlocal reads
        reads += 1
        if reads == 2:  # the read after the write
            raise ApiException(status=503, reason="Service Unavailable")
        return DeploymentReplicas(cluster.replicas, cluster.replicas, {}, cluster.owners)

    monkeypatch.setattr(autoscaling, "deployment_replicas", read_back_fails)
    if isinstance(answer, ApiException):
        cluster.scale_answer_error = answer
    else:
        cluster.scale_answer_lost = True
    with pytest.raises(ApiException):
        cluster.evaluate(settings, T0 + 60)
    assert cluster.replicas == 4
    monkeypatch.setattr(autoscaling, "deployment_replicas", lambda namespace, name:
                        DeploymentReplicas(cluster.replicas, cluster.replicas, {},
                                           cluster.owners))
    assert cluster.evaluate(settings, T0 + 75) == 4  # its +1 counts: a period from now
    stored = cluster.status["autoscaling"]
    assert stored.get("replicaFight") is None and stored["writtenReplicas"] == 4
    assert [e["change"] for e in stored["state"]["scaleEvents"]] == [1]
    assert cluster.evaluate(settings, T0 + 90) == 4 and cluster.replicas == 4


@pytest.mark.parametrize("status", [422, 409])
def test_a_conflict_is_another_writers_change_even_to_the_planned_count(
        monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    """The scale PATCH's test of the replicas failed: another writer changed them first (the
    client never sends a write twice, kube/client.RETRIES), here to the very count planned.
    It is not taken for the operator's own write (no scale event, no Event of its own for
    it): the operator decides again from that count."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    # The fake stores 4 before answering: as if the other writer had.
    cluster.scale_answer_error = ApiException(status=status, reason="Conflict")
    assert cluster.evaluate(settings, T0 + 60) == 5 and cluster.replicas == 5
    stored = cluster.status["autoscaling"]
    assert stored["writtenReplicas"] == 5
    assert [e["change"] for e in stored["state"]["scaleEvents"]] == [1]  # 4 -> 5 only
    records = [d["action"] for d in cluster.status["decisions"]]
    assert records == ["ScaleOut 2 -> 3", "ScaleOut 4 -> 5"], records


def test_a_replicas_write_the_api_server_was_too_busy_for_is_tried_the_next_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """API Priority and Fairness answers 429 to a request it does not take: that was
    reported as ScaleWriteRefused, with a Warning Event and ScalingActive False, which say
    an admission policy or RBAC refused the write."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.scale_refusal = ApiException(status=429, reason="Too Many Requests")
    assert cluster.evaluate(settings, T0) == 3
    assert cluster.replicas == 2 and cluster.events == [] and cluster.status == {}
    cluster.scale_refusal = None
    assert cluster.evaluate(settings, T0 + 15) == 3 and cluster.replicas == 3
    assert cluster.events == ["ScaledOut"]

def test_the_unwritten_status_is_kept_until_a_status_write_lands(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluation after a failed one holds (nothing to write) and its status write fails
    too: the first one's scale event and decision were dropped, and the next evaluation
    added a pod within the period (+2 in 30 s under "+1 pod per 60s")."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    for at in (T0, T0 + 15):
        cluster.status_fails = True
        with pytest.raises(ApiException):
            cluster.evaluate(settings, at)
    assert cluster.evaluate(settings, T0 + 30) == 3 and cluster.replicas == 3
    assert [d["action"] for d in cluster.status["decisions"]] == ["ScaleOut 2 -> 3"]
    assert cluster.events == ["ScaledOut"]  # once, though three evaluations saw it
    assert "ns/t" not in settings.unwritten  # stored now: the status holds it


def test_the_unwritten_records_join_the_stored_list_and_leave_other_writers_entries(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The unwritten patch carried the lists of the older status it was built over: sent
    again, it erased a Ready condition and a decision another writer stored meanwhile."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.status_fails = True
    with pytest.raises(ApiException):
        cluster.evaluate(settings, T0)
    ready = {"type": "Ready", "status": "True", "reason": "Tuned", "message": "m",
             "lastTransitionTime": "2023-11-14T22:13:00Z", "observedGeneration": 1}
    rollout = {"time": "2023-11-14T22:13:00Z", "feature": "rollout", "action": "x",
               "reason": "another writer", "applied": True}
    cluster.status = {"conditions": [ready], "decisions": [rollout]}
    assert cluster.evaluate(settings, T0 + 15) == 3
    assert ready in cluster.status["conditions"]
    assert [d["action"] for d in cluster.status["decisions"]] == ["x", "ScaleOut 2 -> 3"]


class _Lapsing:
    """A Lease held at the start of the evaluation and lost while the Deployment is read."""

    exclusive = True

    def __init__(self) -> None:
        self.leading = True

    def leads(self) -> bool:
        return self.leading


def test_no_replicas_are_written_after_leadership_was_lost_during_the_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Leadership was checked once before the reads; a read queued for longer than the
    Lease (an API server under load) then wrote beside the new leader."""
    cluster = Cluster(monkeypatch, replicas=2)
    leader = _Lapsing()
    settings = autoscaling.AutoscalingSettings(source=None, leader=leader)

    def slow_read(namespace: str, name: str) -> DeploymentReplicas:
        leader.leading = False
        return DeploymentReplicas(cluster.replicas, cluster.replicas, {})

    monkeypatch.setattr(autoscaling, "deployment_replicas", slow_read)
    assert cluster.evaluate(settings, T0) == 3  # decided, and not written
    assert cluster.replicas == 2 and cluster.events == [] and cluster.status == {}
    leader.leading = True
    monkeypatch.setattr(autoscaling, "deployment_replicas", lambda namespace, name:
                        DeploymentReplicas(cluster.replicas, cluster.replicas, {}))
    assert cluster.evaluate(settings, T0 + 1) == 3 and cluster.replicas == 3



def test_a_process_that_lost_the_lease_after_its_replicas_write_leaves_the_status(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Leadership was asked before the replicas write only: a status write that waited
    (a conflict read again, an API server under load) went out after the next leader's,
    and wrote an older evaluation over it. Its scale is announced, and kept for when it
    leads again in the same term."""
    cluster = Cluster(monkeypatch, replicas=2)
    leader = _Lapsing()
    settings = autoscaling.AutoscalingSettings(source=None, leader=leader)
    apps = autoscaling.client.AppsV1Api

    class LeaseLostMeanwhile(apps):  # type: ignore[misc, valid-type]
        def patch_namespaced_deployment_scale(self, *args: Any) -> None:
            super().patch_namespaced_deployment_scale(*args)
            leader.leading = False

    monkeypatch.setattr(autoscaling.client, "AppsV1Api", LeaseLostMeanwhile)
    assert cluster.evaluate(settings, T0) == 3
    assert cluster.replicas == 3 and cluster.events == ["ScaledOut"] and cluster.status == {}
    monkeypatch.setattr(autoscaling.client, "AppsV1Api", apps)
    leader.leading = True  # its own record still stood: the same term
    assert cluster.evaluate(settings, T0 + 15) == 3  # the period's +1 is spent
    assert [d["action"] for d in cluster.status["decisions"]] == ["ScaleOut 2 -> 3"]


@pytest.mark.parametrize(("meanwhile", "written"), [
    ("the next leader evaluated", False),
    ("the controller wrote its conditions", True),
    ("nothing new; the stamp was ahead already", True),  # a clock ahead: no later evaluation
])
def test_a_status_write_met_by_a_conflict_never_replaces_a_later_evaluation(
        monkeypatch: pytest.MonkeyPatch, meanwhile: str, written: bool) -> None:
    """The status write of an old leader met a conflict (409), read the status again and
    was built over it: over the next leader's evaluation too, whose scale event and
    written replicas it replaced with its own older state."""
    from infertune.controller import status_patch

    cluster = Cluster(monkeypatch, replicas=2)
    ready = {"type": "Ready", "status": "True", "reason": "Tuned", "message": "m",
             "lastTransitionTime": format_time(T0 - 60), "observedGeneration": 1}
    ahead = {"autoscaling": {"evaluated": format_time(T0 + 3600), "target": "llm"}}
    read = ahead if meanwhile.startswith("nothing") else {}
    later = {"autoscaling": {
        "evaluated": format_time(T0 + 15), "target": "llm", "currentReplicas": 3,
        "writtenReplicas": 4, "writtenTarget": "llm",
        "state": {"scaleEvents": [{"time": format_time(T0 + 15), "change": 1}]}}}
    stored = {"the next leader evaluated": later,
              "the controller wrote its conditions": {"conditions": [ready]},
              "nothing new; the stamp was ahead already": {**ahead, "conditions": [ready]},
              }[meanwhile]

    class Tunings:
        def patch_namespaced_custom_object_status(self, *args: Any) -> None:
            body = args[-1]
            if body.get("metadata", {}).get("resourceVersion") == "1":
                raise ApiException(status=409, reason="Conflict")
            cluster.status = merge_patch(cluster.status, copy.deepcopy(body["status"]))

        def get_namespaced_custom_object_status(self, *args: Any) -> dict[str, Any]:
            cluster.status = copy.deepcopy(stored)
            return {"metadata": {"resourceVersion": "2"},
                    "spec": {"autoscaling": {"enabled": True}},
                    "status": copy.deepcopy(stored)}

        def get_namespaced_custom_object(self, *args: Any) -> dict[str, Any]:
            return {"metadata": {"generation": 1}}

    monkeypatch.setattr(autoscaling.client, "CustomObjectsApi", Tunings)
    monkeypatch.setattr(autoscaling, "write_status", status_patch.write_status)
    settings = autoscaling.AutoscalingSettings(source=None)
    autoscaling.evaluate("ns", "t", 1, SPEC, copy.deepcopy(read), busy(T0), settings,
                         Writers(), {}, T0, "1")
    assert cluster.replicas == 3 and cluster.events == ["ScaledOut"]
    if written:
        assert cluster.status["autoscaling"]["evaluated"] == format_time(T0)
        assert ready in cluster.status["conditions"]
    else:
        assert cluster.status == later

def test_a_writer_reverting_each_write_of_a_slow_rate_limit_is_a_fight(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Argo CD self-heal puts Git's 2 back after every write. Each write waited a 15 min
    period, longer than the quiet time, so the fight ended before every next revert: 16 GPU
    pods started and killed in 4 hours, and ScalingActive said Scaling throughout."""
    spec = InferenceTuningSpec.model_validate({
        "targetRef": {"name": "llm"}, "engine": "vllm",
        "autoscaling": {"minReplicas": 1, "maxReplicas": 50,
                        "scaleUp": {"pods": 1, "percent": 0, "period": "15m"}}})
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    writes = 0
    for i in range(4 * 240):  # 4 hours at 15 s
        now = T0 + 15 * i
        autoscaling.evaluate("ns", "t", 1, spec, copy.deepcopy(cluster.status), busy(now),
                             settings, Writers(), {}, now, "1")
        writes += cluster.replicas != 2
        cluster.replicas = 2  # self-heal
    active = next(c for c in cluster.status["conditions"] if c["type"] == "ScalingActive")
    assert (active["status"], active["reason"]) == ("False", "ReplicaFight")
    # Writes at 0 and 15 min make the fight; then one retry after each backoff of 5, 10,
    # 20, 40, 60 and 60 min.
    assert writes == 8, writes


def _reverted_every(monkeypatch: pytest.MonkeyPatch, minutes: int,
                    hours: int = 12) -> tuple[Cluster, int, int, int]:
    """A busy tuning whose replicas another writer puts back to 2 every `minutes`: the
    cluster, the writes, the reverts, and the most reverts one fight counted."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    writes = reverts = most = 0
    for i in range(hours * 240):  # at 15 s
        now = T0 + 15 * i
        before = cluster.replicas
        cluster.evaluate(settings, now)
        writes += cluster.replicas != before
        most = max(most, (cluster.status["autoscaling"].get("replicaFight") or {}).get(
            "reverts", 0))
        if i and i % (minutes * 4) == 0:  # the reconcile puts Git's 2 back
            reverts += cluster.replicas != 2
            cluster.replicas = 2
    return cluster, writes, reverts, most


@pytest.mark.parametrize(("every_min", "hours", "fewer_writes"), [
    (20, 3, True), (60, 12, True), (150, 10, False)])
def test_a_writer_reverting_now_and_then_is_a_fight_and_each_revert_is_said(
        monkeypatch: pytest.MonkeyPatch, every_min: int, hours: int, fewer_writes: bool) -> None:
    """Flux corrects drift at each reconcile of its Kustomization (`interval: 1h` is
    common): with a 10 minute quiet time every revert was the fight's first, writes never
    stopped, and nothing said that the replicas were being taken away."""
    cluster, writes, reverts, most = _reverted_every(monkeypatch, every_min, hours)
    assert most == reverts > 2
    said = cluster.events.count("ReplicasReverted")
    fights = cluster.events.count("ReplicaFight")
    # The first revert is said as a Warning; the second stops writes and says so.
    assert (said, fights) == (1, reverts - 1), cluster.events
    # Side by side with the 10 minute quiet time: the writes the backoff saved.
    monkeypatch.setattr(fights_module, "QUIET_S", 600.0)
    before, writes_before, _, most_before = _reverted_every(monkeypatch, every_min, hours)
    assert most_before == 1 and "ReplicaFight" not in before.events
    if fewer_writes:
        assert writes < writes_before * 0.8, (writes, writes_before)
    else:
        # Reverts further apart than the longest backoff so far: the replicas are back
        # before the next one either way; the fight says what goes on.
        assert writes == writes_before


def test_one_revert_is_said_once_and_does_not_stop_writes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    cluster.replicas = 2  # a person, a script
    for i in range(1, 8):
        cluster.evaluate(settings, T0 + 15 * i)
    assert cluster.events.count("ReplicasReverted") == 1, cluster.events
    assert "ReplicaFight" not in cluster.events
    assert cluster.replicas > 2  # writes went on
    assert cluster.status["autoscaling"]["replicaFight"]["reverts"] == 1


@pytest.mark.parametrize("between", ["re-created", "autoscaling removed"])
def test_what_was_written_for_a_tuning_gone_since_is_no_revert_of_the_next(
        monkeypatch: pytest.MonkeyPatch, between: str) -> None:
    """The tuning was deleted (or its autoscaling removed), the team set the replicas back,
    and the tuning came back: the count this process wrote for the old one was kept, so the
    first evaluation counted the team's count as a revert, and one later kubectl scale
    stopped autoscaling for 5 minutes."""
    raw = {"targetRef": {"name": "llm"}, "engine": "vllm",
           "autoscaling": {"minReplicas": 1, "maxReplicas": 50,
                           "scaleUp": {"pods": 1, "percent": 0, "period": "60s"}}}
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert settings.parse("ns", "t", "uid-1", 1, raw) is not None
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    if between == "re-created":
        assert settings.parse("ns", "t", "uid-2", 1, raw) is not None
    else:
        no_scaling = {k: v for k, v in raw.items() if k != "autoscaling"}
        assert settings.parse("ns", "t", "uid-1", 2, no_scaling) is None
        assert settings.parse("ns", "t", "uid-1", 3, raw) is not None
    cluster.replicas, cluster.status = 2, {}
    cluster.evaluate(settings, T0 + 7200)
    assert cluster.status["autoscaling"].get("replicaFight") is None


@pytest.mark.parametrize(("owners", "fight"), [
    ((("infertune", "scale"),), False),  # the API server says: our write
    ((("argocd-controller", ""),), True),  # someone else's
    ((), True),  # not known: a revert, as before
])
def test_a_restart_between_the_replicas_and_the_status_write_is_not_a_revert(
        monkeypatch: pytest.MonkeyPatch, owners: tuple[tuple[str, str], ...],
        fight: bool) -> None:
    """The operator wrote 3 and stopped before its status write: the next one (a restart, a
    rolling upgrade) found 3 where the status said 2 were written, and took its own write
    for a revert."""
    cluster = Cluster(monkeypatch, replicas=2)
    cluster.status_fails = True
    with pytest.raises(ApiException):
        cluster.evaluate(autoscaling.AutoscalingSettings(source=None), T0)
    assert cluster.replicas == 3
    cluster.status = {"autoscaling": {"writtenReplicas": 2, "writtenTarget": "llm"}}
    cluster.owners = owners
    restarted = autoscaling.AutoscalingSettings(source=None)
    cluster.evaluate(restarted, T0 + 15)
    assert (cluster.status["autoscaling"].get("replicaFight") is not None) is fight



def test_a_restart_between_the_replicas_and_the_status_write_keeps_its_scale_event(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator wrote 3 and stopped before its status write. The next process took the
    write for its own (managedFields), but decided from a state without its scale event and
    added another pod 15 s later under "+1 pod per 60s". The API server keeps no time for
    the scale write (e2e), so it counts from when it is found."""
    cluster = Cluster(monkeypatch, replicas=2)
    cluster.status_fails = True
    with pytest.raises(ApiException):
        cluster.evaluate(autoscaling.AutoscalingSettings(source=None), T0)
    assert cluster.replicas == 3
    cluster.status = {"autoscaling": {"writtenReplicas": 2, "writtenTarget": "llm",
                                      "target": "llm", "currentReplicas": 2,
                                      "evaluated": format_time(T0 - 15)}}
    cluster.owners = (("infertune", "scale"),)
    cluster.events.clear()  # those of the process that stopped
    restarted = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(restarted, T0 + 15) == 3
    stored = cluster.status["autoscaling"]
    assert stored["state"]["scaleEvents"] == [{"time": format_time(T0 + 15), "change": 1}]
    # Said in an Event, once: every change of replicas says what it was (it was only logged).
    assert cluster.events == ["ScaledOut"]
    assert cluster.messages[-1].startswith("2 -> 3 replicas of llm: a write of the operator's "
                                           "that no status held"), cluster.messages
    assert stored["writtenReplicas"] == 3 and stored.get("replicaFight") is None
    assert cluster.evaluate(restarted, T0 + 60) == 3
    assert cluster.evaluate(restarted, T0 + 75) == 4  # a period after it was found
    # Without writtenReplicas (autoscaling was disabled at the last evaluation): the count
    # that evaluation saw.
    cluster.status_fails = True
    with pytest.raises(ApiException):
        cluster.evaluate(restarted, T0 + 150)
    assert cluster.replicas == 5
    cluster.status = {"autoscaling": {"target": "llm", "currentReplicas": 4}}
    cluster.events.clear()
    assert cluster.evaluate(autoscaling.AutoscalingSettings(source=None), T0 + 165) == 5
    assert [e["change"] for e in cluster.status["autoscaling"]["state"]["scaleEvents"]] == [1]
    assert cluster.events == ["ScaledOut"] and cluster.messages[-1].startswith("4 -> 5 ")


def _reverts(cluster: Cluster) -> int:
    return int((cluster.status["autoscaling"].get("replicaFight") or {}).get("reverts") or 0)


@pytest.mark.parametrize(("writers", "owner"), [
    (Writers(hpa="llm"), ("horizontal-pod-autoscaler", "scale")),
    (Writers(tunings=("other",)), ("kubectl", "scale")),
])
def test_counts_set_while_another_writer_holds_the_writes_are_no_reverts(
        monkeypatch: pytest.MonkeyPatch, writers: Writers, owner: tuple[str, str]) -> None:
    """An HPA (or a second tuning) held the writes after the operator wrote 3, and the
    replicas were set to 5 meanwhile: stored as a revert, and one kubectl scale after the
    other writer went stopped the writes for a ReplicaFight (e2e/test_scale_writes.py has
    it against the API server)."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    cluster.replicas, cluster.owners = 5, (owner,)
    cluster.evaluate(settings, T0 + 15, writers)
    assert cluster.replicas == 5 and _reverts(cluster) == 0
    assert "ReplicasReverted" not in cluster.events
    cluster.evaluate(settings, T0 + 75)  # the other writer is gone: written again
    assert cluster.replicas == 6 and _reverts(cluster) == 0  # one pod per minute
    cluster.replicas, cluster.owners = 2, (("kubectl", "scale"),)
    cluster.evaluate(settings, T0 + 90)
    fight = cluster.status["autoscaling"]["replicaFight"]
    assert fight["reverts"] == 1 and "retryAt" not in fight, fight


def test_a_revert_seen_by_a_pass_that_lost_the_lease_is_seen_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass saw the revert, then found the Lease lapsed and returned without storing
    it; renewed in the same term, the process took the count it remembered (none, after
    the revert) and the revert was never counted: the fight took one more round of writes."""
    cluster = Cluster(monkeypatch, replicas=2)
    leader = _Lapsing()
    settings = autoscaling.AutoscalingSettings(source=None, leader=leader)
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    cluster.replicas = 2  # Argo CD self-heal

    def lapse_during_read(namespace: str, name: str) -> DeploymentReplicas:
        leader.leading = False
        return DeploymentReplicas(cluster.replicas, cluster.replicas, {})

    monkeypatch.setattr(autoscaling, "deployment_replicas", lapse_during_read)
    cluster.evaluate(settings, T0 + 60)
    assert cluster.replicas == 2 and _reverts(cluster) == 0  # nothing written or stored
    leader.leading = True
    monkeypatch.setattr(autoscaling, "deployment_replicas", lambda namespace, name:
                        DeploymentReplicas(cluster.replicas, cluster.replicas, {}))
    cluster.evaluate(settings, T0 + 75)
    assert _reverts(cluster) == 1


def test_a_revert_seen_when_the_replicas_changed_twice_while_deciding_is_seen_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Both attempts met a changed count (the test of the replicas failed twice): the pass
    returned without storing the revert its first read saw, and the next one, taking the
    count this process remembered (none, after a revert), did not see it."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    cluster.replicas = 2  # reverted
    apps = autoscaling.client.AppsV1Api
    conflicts = 0

    class Moving(apps):  # type: ignore[misc, valid-type]
        def patch_namespaced_deployment_scale(self, name: str, namespace: str,
                                              ops: list[dict[str, Any]]) -> None:
            nonlocal conflicts
            conflicts += 1
            cluster.replicas += 1  # another writer, just before
            raise ApiException(status=422, reason="the test of /spec/replicas failed")

    monkeypatch.setattr(autoscaling.client, "AppsV1Api", Moving)
    cluster.evaluate(settings, T0 + 60)
    assert conflicts == 2 and _reverts(cluster) == 0
    monkeypatch.setattr(autoscaling.client, "AppsV1Api", apps)
    cluster.evaluate(settings, T0 + 75)
    assert _reverts(cluster) == 1


def test_in_dry_run_a_count_set_by_hand_is_no_revert(monkeypatch: pytest.MonkeyPatch) -> None:
    """DryRun writes nothing, so the replicas are the user's: a count changed by hand after
    Enforce had written one showed a replicaFight in the trial's status."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3
    dry = SPEC.model_copy(update={"mode": Mode.DRY_RUN})
    cluster.replicas = 8
    autoscaling.evaluate("ns", "t", 2, dry, copy.deepcopy(cluster.status), busy(T0 + 15),
                         settings, Writers(), {}, T0 + 15, "1")
    assert cluster.replicas == 8 and cluster.status["autoscaling"].get("replicaFight") is None


def test_a_lost_scale_event_found_is_kept_when_that_status_write_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A write landed unseen (its answer and the read-back both lost); the next pass found
    it in the managedFields, but its status write failed, and nothing kept it: the pass
    after scaled again 30 s after the last pod, under "+1 pod per 60s"."""
    cluster = Cluster(monkeypatch, replicas=2)
    cluster.owners = (OWN_SCALE_WRITE,)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3
    reads = 0

    def brownout(namespace: str, name: str) -> DeploymentReplicas:
        nonlocal reads
        reads += 1
        if reads == 2:  # the read-back after the lost answer
            raise ApiException(status=503, reason="Service Unavailable")
        return DeploymentReplicas(cluster.replicas, cluster.replicas, {}, cluster.owners)

    monkeypatch.setattr(autoscaling, "deployment_replicas", brownout)
    cluster.scale_answer_lost = True
    with pytest.raises(ApiException):
        cluster.evaluate(settings, T0 + 60)
    assert cluster.replicas == 4
    cluster.status_fails = True
    with pytest.raises(ApiException):
        assert cluster.evaluate(settings, T0 + 75) == 4  # found, held, not stored
    assert cluster.evaluate(settings, T0 + 90) == 4 and cluster.replicas == 4
    assert cluster.evaluate(settings, T0 + 140) == 5  # 65 s after it was found


def test_evaluations_that_keep_failing_say_so_in_scaling_active(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An evaluation that raised every slot (a missing `get deployments`, a spec the engine
    could not take) was only logged: ScalingActive and MetricsAvailable kept saying Scaling
    and Found from the last one that ran."""
    import asyncio

    writes: list[dict[str, Any]] = []
    stored = {"conditions": [
        {"type": "ScalingActive", "status": "True", "reason": "Scaling", "message": "m",
         "observedGeneration": 1, "lastTransitionTime": "2026-12-03T10:00:00Z"},
        {"type": "MetricsAvailable", "status": "True", "reason": "Found", "message": "m",
         "observedGeneration": 1, "lastTransitionTime": "2026-12-03T10:00:00Z"}]}

    def write(namespace: str, name: str, status: Any, version: Any, build: Any) -> None:
        patch = build(status)
        if patch is not None:
            writes.append(patch)

    monkeypatch.setattr(autoscaling, "_write_if_present", write)
    settings = autoscaling.AutoscalingSettings(source=None)
    refused = ApiException(status=403, reason="Forbidden")
    refused.body = '{"message": "deployments.apps \\"llm\\" is forbidden"}'

    async def fail(times: int, status: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(times):
            await autoscaling._after_failure(loop, settings, "ns", "t", 1, status, "1",
                                             refused)

    asyncio.run(fail(1, stored))
    assert writes == []  # one failure: an API server's hiccup, not said
    asyncio.run(fail(1, stored))
    assert len(writes) == 1
    conditions = {c["type"]: c for c in writes[0]["conditions"]}
    active = conditions["ScalingActive"]
    assert (active["status"], active["reason"]) == ("False", "EvaluationFailed")
    assert active["message"].startswith(
        'evaluations keep failing, so replicas are neither decided nor written: 403 '
        'deployments.apps "llm" is forbidden')
    # NotEvaluated, as the controller says them while nothing is evaluated: they reused
    # ScalingActive's reason, two names for one state where alerts key on the reason.
    assert (conditions["MetricsAvailable"]["status"],
            conditions["MetricsAvailable"]["reason"]) == ("Unknown", "NotEvaluated")
    assert (conditions["ScalingLimited"]["status"], conditions["ScalingLimited"]["reason"],
            conditions["ScalingLimited"]["message"]) == (
        "Unknown", "NotEvaluated", "nothing is decided (see ScalingActive)")
    asyncio.run(fail(3, {"conditions": writes[0]["conditions"]}))
    assert len(writes) == 1  # said once while the same error lasts
    settings.forget("ns/t")  # (an evaluation that runs resets the count the same way)
    asyncio.run(fail(1, stored))
    assert len(writes) == 1


def test_a_failed_write_that_landed_late_is_no_longer_reported_failed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The 504'd write landed after its read-back: every Hold after it still said
    ScaleWriteFailed ("may still land"), with the replicas at the count it asked for."""
    cluster = Cluster(monkeypatch, replicas=2)
    cluster.owners = (OWN_SCALE_WRITE,)
    settings = autoscaling.AutoscalingSettings(source=None)
    apps = autoscaling.client.AppsV1Api
    pending = _answered_without_storing(monkeypatch, TIMED_OUT)
    cluster.evaluate(settings, T0)
    assert _scaling_active(cluster)["reason"] == "ScaleWriteFailed"
    monkeypatch.setattr(autoscaling.client, "AppsV1Api", apps)
    cluster.replicas = pending[0]
    autoscaling.evaluate("ns", "t", 1, SPEC, copy.deepcopy(cluster.status), _steady(T0 + 15),
                         settings, Writers(), {}, T0 + 15, "1")
    assert cluster.replicas == 3 and _scaling_active(cluster)["reason"] == "Scaling"
    assert [e["change"] for e in cluster.status["autoscaling"]["state"]["scaleEvents"]] == [1]


def test_a_refused_write_is_not_reported_for_another_target(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.targetRef changed after a refusal: the new Deployment's Holds kept saying that
    writing to the old one was refused."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.scale_refusal = ApiException(status=403, reason="Forbidden")
    cluster.evaluate(settings, T0)
    assert _scaling_active(cluster)["reason"] == "ScaleWriteRefused"
    other = SPEC.model_copy(update={"target_ref": SPEC.target_ref.model_copy(
        update={"name": "llm-v2"})})
    autoscaling.evaluate("ns", "t", 2, other, copy.deepcopy(cluster.status), _steady(T0 + 15),
                         settings, Writers(), {}, T0 + 15, "1")
    assert _scaling_active(cluster)["reason"] == "Scaling"


def test_a_failed_write_that_lands_while_the_next_one_writes_is_still_ours(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The 504'd 3 -> 4 landed just before the next evaluation's write, whose test of the
    replicas then failed: its second attempt, remembering 3, took the 4 for a revert, wrote
    4 -> 5 and counted only that pod in the rate limits."""
    cluster = Cluster(monkeypatch, replicas=2)
    cluster.owners = (OWN_SCALE_WRITE,)
    settings = autoscaling.AutoscalingSettings(source=None)
    apps = autoscaling.client.AppsV1Api
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    pending = _answered_without_storing(monkeypatch, TIMED_OUT)
    cluster.evaluate(settings, T0 + 60)
    assert cluster.replicas == 3 and pending == [4]

    class LandsFirst(apps):  # type: ignore[misc, valid-type]
        def patch_namespaced_deployment_scale(self, name: str, namespace: str,
                                              ops: list[dict[str, Any]]) -> None:
            if cluster.replicas == 3:  # the 504'd request is stored just before this one
                cluster.replicas = 4
                raise ApiException(status=422, reason="the test of /spec/replicas failed")
            super().patch_namespaced_deployment_scale(name, namespace, ops)

    monkeypatch.setattr(autoscaling.client, "AppsV1Api", LandsFirst)
    cluster.evaluate(settings, T0 + 135)
    stored = cluster.status["autoscaling"]
    assert stored.get("replicaFight") is None
    assert cluster.replicas == 4  # its +1 is the period's: no 4 -> 5 now
    assert [e["change"] for e in stored["state"]["scaleEvents"]] == [1]


def test_a_reported_failure_is_not_written_over_a_tuning_without_autoscaling(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Built again after a conflict with the removal of spec.autoscaling, the report put
    ScalingActive and MetricsAvailable back, where nothing would remove them."""
    seen: dict[str, Any] = {}

    def write_status(namespace: str, name: str, status: Any, version: Any, build: Any,
                     still: Any = None) -> None:
        seen["still"] = still

    monkeypatch.setattr(autoscaling, "write_status", write_status)
    autoscaling._write_if_present("ns", "t", {}, "1", lambda stored: {"conditions": []})
    assert seen["still"] is not None
    assert seen["still"]({"spec": {"autoscaling": {"enabled": True}}})
    assert not seen["still"]({"spec": {"targetRef": {"name": "llm"}}})


def test_a_revert_seen_by_a_pass_whose_status_write_fails_is_seen_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The second revert should stop the writes, but the status write of the pass that saw
    it failed (it wrote nothing: the rate limit): its fight was in no status and the count
    the operator wrote was forgotten, so the next pass saw no revert and wrote again, one
    more pod started and killed, with no ReplicaFight."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    cluster.replicas = 2  # reverted
    cluster.evaluate(settings, T0 + 75)  # revert 1 seen and said; writes 3 again
    assert cluster.replicas == 3 and cluster.events[-1] == "ReplicasReverted"
    cluster.replicas = 2  # reverted again
    cluster.status_fails = True
    with pytest.raises(ApiException):
        cluster.evaluate(settings, T0 + 90)  # revert 2 seen; the rate limit writes nothing
    assert cluster.replicas == 2
    cluster.evaluate(settings, T0 + 105)
    assert cluster.replicas == 2  # no write: the fight stops them
    fight = cluster.status["autoscaling"]["replicaFight"]
    assert fight["reverts"] == 2 and fight.get("retryAt"), fight
    assert _scaling_active(cluster)["reason"] == "ReplicaFight"
    assert cluster.events.count("ReplicaFight") == 1, cluster.events


def test_a_deployment_created_again_is_another_object_not_a_revert(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Argo CD's Replace=true (or `helm --force`, a selector change) deletes the Deployment
    and creates it again from Git with its 2 replicas: each time was taken for a revert of
    the operator's 3, and the second made a ReplicaFight that blamed GitOps and stopped the
    writes for 5 minutes."""
    cluster = Cluster(monkeypatch, replicas=2)
    cluster.created = T0 - 86400
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    for again in (T0 + 600, T0 + 1200):
        cluster.replicas, cluster.created = 2, again - 5  # deleted, created from Git
        cluster.evaluate(settings, again)
        assert cluster.replicas == 3  # scaled as a new target is
        cluster.evaluate(settings, again + 75)
    assert "ReplicasReverted" not in cluster.events and "ReplicaFight" not in cluster.events
    assert cluster.status["autoscaling"].get("replicaFight") is None
    # The same object put back to 2 is still a revert, as before.
    cluster.replicas = 2
    cluster.evaluate(settings, T0 + 1400)
    assert cluster.events[-1] == "ReplicasReverted", cluster.events
    # Created again in the very second of the last evaluation (creationTimestamp has whole
    # seconds): still another object.
    cluster.evaluate(settings, T0 + 1430.4)  # the replicas as written (the rate limit)
    cluster.replicas, cluster.created = 1, float(int(T0 + 1430.4))
    cluster.evaluate(settings, T0 + 1445)
    assert cluster.events.count("ReplicasReverted") == 1, cluster.events
    assert "ReplicaFight" not in cluster.events
    # And a process that restarted reads the stored count the same way.
    fresh = autoscaling.AutoscalingSettings(source=None)
    cluster.replicas, cluster.created = 2, T0 + 1500
    cluster.evaluate(fresh, T0 + 1510)
    assert cluster.events.count("ReplicasReverted") == 1


def test_status_writes_that_keep_failing_after_replicas_writes_say_replicas_are_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The replicas writes land and only the status writes fail (a status the CRD's schema
    refuses, an etcd that times out on it): ScalingActive said "replicas are neither
    decided nor written" while they were, each with its Event."""
    import asyncio

    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    reported: list[dict[str, Any]] = []

    def write(namespace: str, name: str, status: Any, version: Any, build: Any) -> None:
        reported.append(build(status))

    async def report(exc: Exception) -> None:
        await autoscaling._after_failure(asyncio.get_running_loop(), settings, "ns", "t", 1,
                                         cluster.status, "1", exc)

    monkeypatch.setattr(autoscaling, "_write_if_present", write)
    for now in (T0, T0 + 60):
        cluster.status_fails = True
        with pytest.raises(ApiException) as raised:
            cluster.evaluate(settings, now)
        asyncio.run(report(raised.value))
    assert cluster.replicas == 4 and cluster.events == ["ScaledOut", "ScaledOut"]
    conditions = {c["type"]: c for c in reported[-1]["conditions"]}
    assert conditions["ScalingActive"]["message"].startswith(
        "the status of evaluations cannot be written: 500 ")
    assert "replicas are still decided and written" in conditions["ScalingActive"]["message"]
    assert conditions["MetricsAvailable"]["message"] == "not recorded: see ScalingActive"
    # Decided all the same: ScalingLimited does not say nothing is, nor either reason that
    # nothing is evaluated.
    assert conditions["ScalingLimited"]["message"] == "not recorded: see ScalingActive"
    assert conditions["MetricsAvailable"]["reason"] == conditions["ScalingLimited"][
        "reason"] == "NotRecorded"
    # Then the passes fail before deciding (the Deployment cannot be read): no longer said
    # to decide and write, though the unwritten status is still kept for the next one.
    monkeypatch.setattr(autoscaling, "deployment_replicas", lambda namespace, name: (
        _ for _ in ()).throw(ApiException(status=403, reason="Forbidden")))
    for now in (T0 + 75, T0 + 90):
        with pytest.raises(ApiException) as raised:
            cluster.evaluate(settings, now)
        asyncio.run(report(raised.value))
    assert "ns/t" in settings.unwritten
    conditions = {c["type"]: c for c in reported[-1]["conditions"]}
    assert conditions["ScalingActive"]["message"].startswith(
        "evaluations keep failing, so replicas are neither decided nor written: 403")
    assert conditions["MetricsAvailable"]["reason"] == "NotEvaluated"


def planned_with(monkeypatch: pytest.MonkeyPatch, argument: str) -> list[Any]:
    """The value of plan_evaluation's keyword `argument` at each call from now on."""
    passed: list[Any] = []
    real = autoscaling.plan_evaluation

    def plan(*args: Any, **kwargs: Any) -> Any:
        passed.append(kwargs.get(argument))
        return real(*args, **kwargs)

    monkeypatch.setattr(autoscaling, "plan_evaluation", plan)
    return passed


def test_the_last_pod_seen_terminating_reaches_the_plan_and_is_remembered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Batching mode Auto reads the running requests for a flag the engine ignores only from
    after the last terminating pod is gone (scaling_report._ignored): by its
    deletionTimestamp while it terminates, and once kopf's index has dropped the pod, by a
    margin (for Prometheus's last sample of it; the caller gives the metrics window) after
    that was seen if earlier, remembered; a process that just started, which saw none,
    counts from its start."""
    from infertune.tuning.retune import PodView

    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    settings.started = T0 - 3600
    serving = PodView("a", "r2", True)
    settings.saw_pods("ns/t", [serving, PodView("b", "r1", True, terminating=True,
                                                gone_by=T0 + 30)], T0, 10)
    assert settings.pods_gone_by("ns/t") == T0 + 30  # its grace period's end, while there
    settings.saw_pods("ns/t", [serving], T0 + 25, 10)  # gone from the index, later + 10 s
    passed = planned_with(monkeypatch, "pods_gone_by")
    cluster.evaluate(settings, T0 + 45)
    assert passed == [T0 + 30]
    # Gone long before its grace period ended (the containers stopped at once, as most do):
    # gone by the margin after the index no longer had it, not 2 minutes later; remembered
    # after that, also when a later pod's own bound is earlier, and a later pod that leaves
    # the same way counts from its own; two leaving at once, by the later.
    early = autoscaling.AutoscalingSettings(source=None)
    early.started = T0 - 3600
    early.saw_pods("ns/t", [serving, PodView("b", "r1", True, terminating=True,
                                             gone_by=T0 + 120)], T0, 10)
    early.saw_pods("ns/t", [serving], T0 + 2, 10)
    assert early.pods_gone_by("ns/t") == T0 + 12
    early.saw_pods("ns/t", [serving], T0 + 4, 10)
    assert early.pods_gone_by("ns/t") == T0 + 12
    early.saw_pods("ns/t", [serving, PodView("c", "r1", False, terminating=True,
                                             gone_by=T0 + 5)], T0 + 6, 10)
    early.saw_pods("ns/t", [serving], T0 + 8, 10)
    assert early.pods_gone_by("ns/t") == T0 + 12  # c's bound, T0 + 5, is earlier
    early.saw_pods("ns/t", [serving, PodView("d", "r1", False, terminating=True,
                                             gone_by=T0 + 200),
                            PodView("e", "r1", False, terminating=True,
                                    gone_by=T0 + 22)], T0 + 10, 10)
    assert early.pods_gone_by("ns/t") == T0 + 200
    early.saw_pods("ns/t", [serving], T0 + 14, 10)
    assert early.pods_gone_by("ns/t") == T0 + 24
    fresh = autoscaling.AutoscalingSettings(source=None)
    fresh.saw_pods("ns/t", [serving], T0, 10)
    assert fresh.pods_gone_by("ns/t") == fresh.started


def test_when_the_last_ready_pod_became_ready_reaches_the_plan_when_the_index_knows_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """engine._track_serving counts pods that joined from their Ready time: the second after
    the latest of the Ready, not terminating pods in kopf's index (the time is written in
    whole seconds), and only when the index holds at least the Deployment's readyReplicas
    with a time for each (a pod it has not seen may be newer; a terminating one is no
    replica, and standing in for it, its older time was taken for the newcomer's)."""
    from infertune.tuning.retune import PodView

    passed = planned_with(monkeypatch, "ready_since")
    seen = {
        "two Ready": [PodView("a", "r", True, ready_since=T0 - 100),
                      PodView("b", "r", True, ready_since=T0 - 40),
                      PodView("c", "r", False),
                      PodView("d", "r", True, terminating=True, ready_since=T0 - 10)],
        "one Ready seen": [PodView("a", "r", True, ready_since=T0 - 100),
                           PodView("b", "r", False)],
        "a Ready pod without a time": [PodView("a", "r", True, ready_since=T0 - 100),
                                       PodView("b", "r", True)],
        "the other one terminating": [PodView("a", "r", True, ready_since=T0 - 100),
                                      PodView("b", "r", True, terminating=True,
                                              ready_since=T0 - 10)],
    }
    for pods in seen.values():
        cluster = Cluster(monkeypatch, replicas=2)  # readyReplicas 2
        settings = autoscaling.AutoscalingSettings(source=None)
        settings.saw_pods("ns/t", pods, T0, 10)
        cluster.evaluate(settings, T0 + 45)
    assert passed == [T0 - 39, None, None, None]
    settings.forget("ns/t")
    assert "ns/t" not in settings.pods_ready


def test_a_fight_names_the_writer_the_deployment_says_set_the_replicas(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fight blamed "GitOps without ignoreDifferences?" while the Deployment's
    managedFields said a person's `kubectl scale` had set the replicas: the operator reads
    them (for its own writes) and now names the writer in the Warning, the condition and
    status.autoscaling.replicaFight.by."""
    import kopf

    cluster = Cluster(monkeypatch, replicas=2)
    said: list[tuple[str, str]] = []

    def event(_body: Any, *, type: str, reason: str, message: str) -> None:
        said.append((reason, message))

    monkeypatch.setattr(kopf, "event", event)
    settings = autoscaling.AutoscalingSettings(source=None)
    cluster.evaluate(settings, T0)
    for now in (T0 + 75, T0 + 150):
        cluster.replicas, cluster.owners = 2, (("kubectl", "scale"),)
        cluster.evaluate(settings, now)
    reverted = next(m for r, m in said if r == "ReplicasReverted")
    assert reverted.startswith("another writer (kubectl through the scale subresource, as "
                               "the Deployment's managedFields say) changed the replicas of "
                               "llm the operator had written (now 2); 1 more within 3h1m "
                               "and the operator stops writing them"), reverted
    assert cluster.status["autoscaling"]["replicaFight"]["by"] == (
        "kubectl through the scale subresource")
    active = _scaling_active(cluster)
    assert active["reason"] == "ReplicaFight" and active["message"].startswith(
        "another writer (kubectl through the scale subresource, as the Deployment's "
        "managedFields say) reverted the replicas of llm 2 times; replicas are not written "
        "until "), active["message"]
    assert "GitOps" not in active["message"]


def test_writer_of_names_the_managers_of_the_replicas() -> None:
    from infertune.controller.fights import writer_of

    assert writer_of([("argocd-controller", "")]) == "argocd-controller"
    assert writer_of([("kubectl", "scale"), ("flux", "")]) == (
        "kubectl through the scale subresource, flux")
    assert writer_of([]) is None and writer_of([("", "")]) is None
    assert writer_of([("infertune", "scale"), ("kubectl", "")]) == "kubectl"  # not itself


def test_scaling_to_zero_by_hand_is_a_pause_not_a_revert(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`kubectl scale --replicas=0` is how a Deployment is paused (left alone at 0, as HPA
    leaves it): it was taken for a revert of the operator's count, so pausing twice in three
    hours made a ReplicaFight, ScalingActive said ReplicaFight instead of ScaledToZero, and
    after the resume a queue twice the target got no scale-out for 5 minutes."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3 and cluster.replicas == 3
    at = T0
    for _ in range(2):  # paused, resumed, twice
        cluster.replicas = 0
        cluster.evaluate(settings, at + 75)
        cluster.evaluate(settings, at + 90)
        assert cluster.replicas == 0
        assert _scaling_active(cluster)["reason"] == "ScaledToZero"
        # Nothing stored as written either: a process started during the pause counts no
        # revert at the resume.
        assert cluster.status["autoscaling"].get("writtenReplicas") is None
        cluster.replicas = 1
        cluster.evaluate(settings, at + 150)
        assert cluster.replicas == 2, cluster.events  # scaled out at once, a pod a minute
        at += 600
    assert "ReplicasReverted" not in cluster.events and "ReplicaFight" not in cluster.events
    assert cluster.status["autoscaling"].get("replicaFight") is None
    # Said once per pause (a Warning naming the writer, where managedFields say), since no
    # revert says who stopped the serving.
    assert cluster.events.count("ScaledToZero") == 2, cluster.events
    # Put back to another count than 0: still a revert.
    cluster.replicas = 1
    cluster.evaluate(settings, at + 75)
    assert cluster.events[-1] == "ReplicasReverted", cluster.events


def test_a_pause_is_said_once_whatever_scaling_active_says_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The ScaledToZero Warning was keyed on ScalingActive's reason: an evaluation that failed
    in the middle of a pause (EvaluationFailed) had it said again, and a ReplicaFight in its
    backoff (said first) held it back until the backoff ended. Said once per pause, at the
    pause, also when the status write after it fails."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    settings.autoscaled.add("ns/t")  # its loop runs (what it saw is kept for it only)
    assert cluster.evaluate(settings, T0) == 3
    cluster.replicas = 0
    cluster.status_fails = True  # the status write of the pause's first evaluation fails
    with pytest.raises(ApiException):
        cluster.evaluate(settings, T0 + 75)
    assert cluster.events.count("ScaledToZero") == 1, cluster.events
    cluster.evaluate(settings, T0 + 90)
    # Something else said in between (here: an evaluation failure, as _report_failure
    # writes it): not a new pause.
    cluster.status["conditions"] = [
        c if c["type"] != "ScalingActive" else {**c, "reason": "EvaluationFailed"}
        for c in cluster.status["conditions"]]
    cluster.evaluate(settings, T0 + 105)
    assert cluster.events.count("ScaledToZero") == 1, cluster.events
    # A new process (a restart, a new leader) goes by the stored reason.
    fresh = autoscaling.AutoscalingSettings(source=None)
    cluster.evaluate(fresh, T0 + 120)
    assert cluster.events.count("ScaledToZero") == 1, cluster.events
    # So does this one when it leads again after another (which may have said it since).
    settings.paused["ns/t"] = False  # as seen before another leader's term
    settings.leader = type("Again", (), {"term": 2, "leads": lambda self: True})()
    settings.begin_term()
    cluster.evaluate(settings, T0 + 122)
    assert cluster.events.count("ScaledToZero") == 1, cluster.events
    # Resumed and paused again: a new pause.
    cluster.replicas = 1
    cluster.evaluate(settings, T0 + 135)
    cluster.replicas = 0
    cluster.evaluate(settings, T0 + 150)
    assert cluster.events.count("ScaledToZero") == 2, cluster.events


def test_a_pause_during_a_replica_fight_is_said_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """GitOps that fought the operator, then sets replicas: 0 in Git: ScalingActive says
    ReplicaFight while its backoff lasts (up to an hour), and the Warning waited for it."""
    cluster = Cluster(monkeypatch, replicas=2)
    settings = autoscaling.AutoscalingSettings(source=None)
    assert cluster.evaluate(settings, T0) == 3
    for at in (T0 + 75, T0 + 150):  # reverted twice: a fight
        cluster.replicas = 2
        cluster.evaluate(settings, at)
    assert _scaling_active(cluster)["reason"] == "ReplicaFight"
    cluster.replicas = 0
    cluster.evaluate(settings, T0 + 165)
    assert _scaling_active(cluster)["reason"] == "ReplicaFight"  # said first
    assert cluster.events.count("ScaledToZero") == 1, cluster.events
