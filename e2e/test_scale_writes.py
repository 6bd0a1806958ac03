"""The autoscaler's replicas write, against the real API server: `autoscaling.evaluate` called
in this process, with the signals given, so the test decides what happens between the scale
read and the scale write.

The InferenceTuning objects here have no spec.autoscaling (the spec with it is handed to
`evaluate` directly), so an operator that the session may be running does not evaluate them
as well; it only reconciles them, and `write_status` builds its patch again over its writes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kubernetes import client

from e2e.fixtures.operator import OperatorProcess
from e2e.fixtures.waiting import wait_for
from e2e.test_operator import create, deployment
from e2e.test_operator import tuning as tuning_body
from infertune.api.scaling import BatchingMode
from infertune.api.spec import GROUP, PLURAL, VERSION, InferenceTuningSpec
from infertune.controller import autoscaling
from infertune.controller.fights import Writers
from infertune.kube.client import DeploymentReplicas, deployment_replicas
from infertune.scaling.engine import ScaleDecision
from infertune.scaling.signals import Series, TargetSignals, Window
from infertune.tuning.pod_patch import template_batching

pytestmark = pytest.mark.e2e

def new_settings() -> autoscaling.AutoscalingSettings:
    """What the operator keeps between evaluations, new (no Prometheus: signals are given)."""
    return autoscaling.AutoscalingSettings(source=None)


SPEC = InferenceTuningSpec.model_validate({
    "targetRef": {"name": "llm"}, "engine": "vllm",
    "autoscaling": {"minReplicas": 1, "maxReplicas": 8}})


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """kopf.event as `evaluate` calls it, recorded (kopf's event queue runs in the operator)."""
    posted: list[tuple[str, str, str]] = []

    def post(_body: Any, *, type: str, reason: str, message: str) -> None:
        posted.append((type, reason, message))

    monkeypatch.setattr(kopf, "event", post)
    return posted


@pytest.fixture
def default_client(api_client: client.ApiClient) -> Iterator[None]:
    """`evaluate` uses the default ApiClient, as in the operator."""
    client.ApiClient.set_default(api_client)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        client.ApiClient.set_default(None)  # type: ignore[no-untyped-call]


def signals(queue: float, now: float) -> TargetSignals:
    """A queue of `queue` per replica sustained for 30 s, and a healthy latency."""
    window = Window.of_points([(now - 30 + i, queue) for i in range(31)], now, 30.0, 1.0, 32.0)
    return TargetSignals(window, Series(((now - 15, 0.05), (now, 0.05)), 15.0),
                         Series(((now - 15, 10.0), (now, 10.0)), 15.0))


NO_OTHER_WRITERS = Writers()


def evaluate_once(api_client: client.ApiClient, namespace: str, queue: float,
                  settings: autoscaling.AutoscalingSettings,
                  writers: Writers = NO_OTHER_WRITERS) -> ScaleDecision:
    api = client.CustomObjectsApi(api_client)
    body = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "llm")
    meta = body["metadata"]
    now = time.time()
    return autoscaling.evaluate(namespace, "llm", int(meta["generation"]), SPEC,
                                body.get("status") or {}, signals(queue, now), settings,
                                writers, body, now, meta["resourceVersion"])


def scale_of(api_client: client.ApiClient, namespace: str) -> int:
    scale = client.AppsV1Api(api_client).read_namespaced_deployment_scale("llm", namespace)
    return int(scale.spec.replicas)


def autoscaling_status(api_client: client.ApiClient, namespace: str) -> dict[str, Any]:
    body = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "llm")
    return dict(body.get("status") or {})


@pytest.fixture
def target(api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
           monkeypatch: pytest.MonkeyPatch) -> str:
    """A Deployment at 2 replicas and its tuning (the operator fixture installs the CRD).
    The stored tuning has no spec.autoscaling (see the module's docstring), so the check
    that drops a status write for a tuning that lost it is told it still has it."""
    monkeypatch.setattr(autoscaling, "_still_autoscaled", lambda stored: True)
    create(api_client, namespace, deployment("llm", replicas=2))
    create(api_client, namespace, tuning_body("llm", "llm"))
    # The operator's first reconcile, once it has assessed the tuning: landing after the
    # test's evaluation, it took status.autoscaling away (this stored spec has none), and the
    # test read a status without it (seen once in CI).
    wait_for(lambda: "observedGeneration" in (autoscaling_status(api_client, namespace)),
             "the operator to observe the tuning")
    operator.check_running()
    return namespace


def someone_writes_6_after_the_first_read(api_client: client.ApiClient,
                                          monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Another writer sets 6 replicas right after the operator's first read of the
    Deployment; the list holds the replicas each read returned."""
    apps = client.AppsV1Api(api_client)
    real_read = autoscaling.deployment_replicas
    reads: list[int] = []

    def read_then_someone_writes(namespace: str, name: str) -> DeploymentReplicas:
        read = real_read(namespace, name)
        reads.append(read.replicas)
        if len(reads) == 1:
            apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 6}})
        return read

    monkeypatch.setattr(autoscaling, "deployment_replicas", read_then_someone_writes)
    return reads


def test_a_count_written_between_the_read_and_the_write_is_not_overwritten_unseen(
    api_client: client.ApiClient, target: str, default_client: None,
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another writer sets 6 replicas right after the operator read 2. The write over the
    scale's resourceVersion is refused (409), and the decision is made again from the 6: the
    operator's 3 (decided for 2 replicas) used to replace the 6 without anything noticing."""
    reads = someone_writes_6_after_the_first_read(api_client, monkeypatch)
    decision = evaluate_once(api_client, target, 48.0, new_settings())
    assert (reads[0], reads[-1]) == (2, 6)  # decided for 2, then again for the 6
    # 48 waiting per replica against 32: x1.5 from the 6 there are, within maxReplicas 8.
    assert (decision.current_replicas, decision.desired_replicas) == (6, 8), decision.reason
    assert scale_of(api_client, target) == 8
    stored = autoscaling_status(api_client, target)["autoscaling"]
    assert (stored["currentReplicas"], stored["writtenReplicas"]) == (6, 8)
    assert [e[1] for e in events] == ["ScaledOut"]


def test_a_revert_seen_before_a_conflicting_write_is_still_counted(
    api_client: client.ApiClient, target: str, default_client: None,
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator had written 4; someone put 2 back (a revert), and someone else wrote 6
    between the read and the write. The second decision used to start from the stored fight
    with no revert, and the revert was lost exactly when writers raced."""
    api = client.CustomObjectsApi(api_client)
    api.patch_namespaced_custom_object_status(GROUP, VERSION, target, PLURAL, "llm", {
        "status": {"autoscaling": {"writtenReplicas": 4, "writtenTarget": "llm"}}})
    reads = someone_writes_6_after_the_first_read(api_client, monkeypatch)
    evaluate_once(api_client, target, 48.0, new_settings())
    assert reads[0] == 2 and reads[-1] == 6
    fight = autoscaling_status(api_client, target)["autoscaling"]["replicaFight"]
    assert fight["reverts"] == 1


@pytest.mark.parametrize(("writers", "manager"), [
    (Writers(hpa="llm"), "horizontal-pod-autoscaler"),
    (Writers(tunings=("llm-b",)), "kubectl"),
])
def test_counts_set_while_another_writer_holds_the_writes_are_no_reverts(
    api_client: client.ApiClient, target: str, default_client: None,
    events: list[tuple[str, str, str]], writers: Writers, manager: str,
) -> None:
    """The operator wrote 3; then an HPA on the Deployment (or a second tuning of it) held
    its writes, and the replicas were set to 5 meanwhile, by the HPA or by hand. Each count
    was stored as a revert of the operator's 3, with a ReplicasReverted Warning, while
    ScalingActive said the writes were held; once the other writer was gone, one kubectl
    scale was the second revert, and the writes stopped for a ReplicaFight."""
    settings, apps = new_settings(), client.AppsV1Api(api_client)
    # Evaluated in the second the Deployment was created, a count is taken for one of a
    # Deployment created again since (fights.recreated, in whole seconds): no revert.
    created = apps.read_namespaced_deployment("llm", target).metadata.creation_timestamp
    time.sleep(max(0.0, created.timestamp() + 1.05 - time.time()))
    evaluate_once(api_client, target, 48.0, settings)
    assert scale_of(api_client, target) == 3
    apps.patch_namespaced_deployment_scale("llm", target, {"spec": {"replicas": 5}},
                                           field_manager=manager)
    held = evaluate_once(api_client, target, 48.0, settings, writers)
    assert scale_of(api_client, target) == 5 and held.desired_replicas == 8, held.reason
    stored = autoscaling_status(api_client, target)
    assert "replicaFight" not in stored["autoscaling"], stored["autoscaling"]
    active = next(c for c in stored["conditions"] if c["type"] == "ScalingActive")
    assert active["reason"] in ("HorizontalPodAutoscalerPresent", "SeveralTunings"), active
    # The other writer gone: the operator writes again, and one count set by hand is one
    # revert, not a fight.
    evaluate_once(api_client, target, 48.0, settings)
    assert scale_of(api_client, target) == 8
    apps.patch_namespaced_deployment_scale("llm", target, {"spec": {"replicas": 2}},
                                           field_manager="kubectl")
    evaluate_once(api_client, target, 48.0, settings)
    fight = autoscaling_status(api_client, target)["autoscaling"].get("replicaFight")
    assert fight is not None and fight["reverts"] == 1 and "retryAt" not in fight, (
        events, autoscaling_status(api_client, target))
    assert [e[1] for e in events if e[1] == "ReplicasReverted"] == ["ReplicasReverted"]
    assert events[-1][1] == "ReplicasReverted", events


def test_a_write_the_api_server_refuses_is_reported_not_applied(
    api_client: client.ApiClient, target: str, default_client: None,
    events: list[tuple[str, str, str]],
) -> None:
    """An admission policy that refuses the scale write: the status says the decision was not
    applied and why, in the API server's words, and a Warning Event says it too. The
    evaluation used to fail before its status write, leaving nothing but a log line."""
    admission = client.AdmissionregistrationV1Api(api_client)
    name = f"deny-scale-{target}"[:63]
    admission.create_validating_admission_policy({
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["UPDATE"],
                "resources": ["deployments/scale"]}]},
            "validations": [{"expression": "object.spec.replicas <= 2",
                             "message": "platform policy: at most 2 replicas here"}]}})
    admission.create_validating_admission_policy_binding({
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {
                     "kubernetes.io/metadata.name": target}}}}})
    try:
        apps = client.AppsV1Api(api_client)

        def denied() -> bool:
            try:
                apps.patch_namespaced_deployment_scale("llm", target,
                                                       {"spec": {"replicas": 3}})
            except client.ApiException as exc:
                return exc.status == 422
            apps.patch_namespaced_deployment_scale("llm", target, {"spec": {"replicas": 2}})
            return False

        wait_for(denied, "the admission policy in force", timeout_s=30)
        decision = evaluate_once(api_client, target, 48.0, new_settings())
        assert (decision.current_replicas, decision.desired_replicas) == (2, 3)
        assert scale_of(api_client, target) == 2
        status = autoscaling_status(api_client, target)
        active = next(c for c in status["conditions"] if c["type"] == "ScalingActive")
        assert (active["status"], active["reason"]) == ("False", "ScaleWriteRefused")
        assert "platform policy: at most 2 replicas here" in active["message"]
        assert "writing 3 replicas to deployments/scale of llm was refused (422)" in \
            active["message"]
        assert status["autoscaling"].get("writtenReplicas") is None
        assert status["autoscaling"]["state"]["scaleEvents"] == []  # nothing was applied
        assert status["decisions"][-1]["applied"] is False
        assert [(e[0], e[1]) for e in events] == [("Warning", "ScaleWriteRefused")]
        assert "platform policy" in events[0][2]
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


def test_a_pass_planned_before_autoscaling_was_removed_writes_nothing(
    api_client: client.ApiClient, namespace: str, operator: OperatorProcess,
    default_client: None, events: list[tuple[str, str, str]],
) -> None:
    """A pass decides with kopf's copy of the spec; its status is read afresh (the first
    evaluation, or a lagging watch) and so met no conflict. spec.autoscaling removed during
    its fetch: it wrote replicas, and put back status.autoscaling and ScalingActive after the
    controller had removed them, for good."""
    api = client.CustomObjectsApi(api_client)
    create(api_client, namespace, deployment("llm", replicas=2))
    create(api_client, namespace, tuning_body(
        "llm", "llm", autoscaling={"minReplicas": 1, "maxReplicas": 8}))
    stale = wait_for(lambda: (b := api.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "llm")).get("status") and b, "the tuning reported")
    key = f"{namespace}/llm"

    class RemovedDuringTheFetch:
        def fetch(self, targets: Any, now: float) -> Any:
            api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "llm",
                                               {"spec": {"autoscaling": None}})
            return {t.key: signals(48.0, now) for t in targets}

    settings = autoscaling.AutoscalingSettings(
        source=RemovedDuringTheFetch())  # type: ignore[arg-type]
    meta = stale["metadata"]
    parsed = settings.parse(namespace, "llm", meta["uid"], int(meta["generation"]),
                            stale["spec"])
    assert parsed is not None
    autoscaling._evaluate_if_due(settings, key, parsed, [(key, parsed)], namespace, "llm",
                                 int(meta["generation"]), stale.get("status") or {},
                                 meta["resourceVersion"], Writers(), stale)
    assert scale_of(api_client, namespace) == 2  # 48 waiting per replica would have made 3
    assert events == []

    def cleaned() -> bool:
        status = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL,
                                                  "llm").get("status") or {}
        return "autoscaling" not in status and not any(
            c["type"] in ("ScalingActive", "MetricsAvailable", "ScalingLimited")
            for c in status.get("conditions") or [])

    wait_for(cleaned, "no autoscaler status for a tuning without spec.autoscaling")


def test_a_count_written_before_the_report_was_dropped_is_still_announced(
    api_client: client.ApiClient, target: str, default_client: None,
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The status write met a conflict, and the tuning read again no longer wants it
    (spec.autoscaling gone): the report is dropped. The replicas were written before it,
    though, and a change of replicas always says why in an Event."""
    api = client.CustomObjectsApi(api_client)
    monkeypatch.setattr(autoscaling, "_still_autoscaled", lambda stored: False)
    real_read = autoscaling.deployment_replicas

    def read_while_status_changes(namespace: str, name: str) -> DeploymentReplicas:
        api.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "llm", {
            "status": {"decisions": [{"time": "2026-12-04T08:00:00Z", "feature": "rollout",
                                      "action": "x", "reason": "another writer",
                                      "applied": True}]}})
        return real_read(namespace, name)

    monkeypatch.setattr(autoscaling, "deployment_replicas", read_while_status_changes)
    evaluate_once(api_client, target, 48.0, new_settings())
    assert scale_of(api_client, target) == 3  # written before the status, as designed
    assert "autoscaling" not in autoscaling_status(api_client, target)  # the report dropped
    assert [e[1] for e in events] == ["ScaledOut"]
    # Nothing to write (the queue at target): a dropped report announces nothing.
    events.clear()
    evaluate_once(api_client, target, 32.0, new_settings())
    assert events == []


def test_a_spec_changed_while_deciding_gets_no_write_of_the_old_spec(
    api_client: client.ApiClient, target: str, default_client: None,
    events: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass decides with kopf's copy of the spec, taken before the Prometheus fetch and
    the worker queue: DryRun set in that window still got a replicas write."""
    api = client.CustomObjectsApi(api_client)
    real_read = autoscaling.deployment_replicas

    def read_while_someone_sets_dry_run(namespace: str, name: str) -> DeploymentReplicas:
        api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "llm",
                                           {"spec": {"mode": "DryRun"}})
        return real_read(namespace, name)

    monkeypatch.setattr(autoscaling, "deployment_replicas", read_while_someone_sets_dry_run)
    decision = evaluate_once(api_client, target, 48.0, new_settings())
    assert decision.desired_replicas == 3  # what the old spec decided...
    assert scale_of(api_client, target) == 2  # ...is not written
    assert "autoscaling" not in autoscaling_status(api_client, target) and events == []


def test_a_latency_breach_is_sized_on_the_ready_replicas_until_those_added_are_ready(
    api_client: client.ApiClient, target: str, default_client: None,
    events: list[tuple[str, str, str]],
) -> None:
    """P99 twice the target with a low queue and action ScaleOut: 2 Ready replicas take it
    as 4. The 2 added do not get Ready (a quota keeps their pods from being created, as a
    model still loading would keep them unready); the next evaluation holds 4 where, sized
    on every replica, it asked for 8. The ready count is the Deployment's, as the operator
    reads it."""
    apps = client.AppsV1Api(api_client)
    wait_for(lambda: (apps.read_namespaced_deployment("llm", target).status.ready_replicas
                      or 0) == 2, "the 2 pods Ready", timeout_s=60)
    client.CoreV1Api(api_client).create_namespaced_resource_quota(target, {
        "metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "2"}}})
    spec = InferenceTuningSpec.model_validate({
        "targetRef": {"name": "llm"}, "engine": "vllm",
        "autoscaling": {"minReplicas": 1, "maxReplicas": 8, "latency": {"action": "ScaleOut"}}})
    custom = client.CustomObjectsApi(api_client)

    def evaluate_breach() -> ScaleDecision:
        body = custom.get_namespaced_custom_object(GROUP, VERSION, target, PLURAL, "llm")
        now = time.time()
        window = Window.of_points([(now - 30 + i, 5.0) for i in range(31)], now, 30.0, 1.0,
                                  32.0)
        breach = TargetSignals(window, Series(((now - 15, 0.15), (now, 0.15)), 15.0),
                               Series(((now - 15, 10.0), (now, 10.0)), 15.0))
        return autoscaling.evaluate(target, "llm", int(body["metadata"]["generation"]), spec,
                                    body.get("status") or {}, breach, new_settings(),
                                    Writers(), body, now, body["metadata"]["resourceVersion"])

    first = evaluate_breach()
    assert (first.signals.ready_replicas, first.desired_replicas) == (2, 4), first.reason
    assert scale_of(api_client, target) == 4
    second = evaluate_breach()
    assert (second.signals.ready_replicas, second.desired_replicas) == (2, 4), second.reason
    assert "sized on the 2 replicas serving (2 not Ready since they were added) -> 4: the 4 " \
           "replicas cover it once they are Ready" in second.reason
    assert scale_of(api_client, target) == 4
    assert [e[1] for e in events] == ["ScaledOut"]


def test_the_read_says_whether_every_pod_runs_the_current_template(
    api_client: client.ApiClient, target: str, default_client: None,
) -> None:
    """Batching mode Auto concludes that the pods ignore the flag it set only when every pod
    runs the template it reads (`DeploymentReplicas.rolled_out`): during a rollout, the
    running requests are partly the old pods'. As the real Deployment controller reports it:
    a template change it has not rolled out (the Deployment paused) is not rolled out."""
    apps = client.AppsV1Api(api_client)
    wait_for(lambda: deployment_replicas(target, "llm").rolled_out
             and deployment_replicas(target, "llm").ready == 2, "the 2 pods Ready",
             timeout_s=60)
    tuning = SPEC.model_copy(update={"batching": SPEC.batching.model_copy(
        update={"mode": BatchingMode.AUTO})})
    before = deployment_replicas(target, "llm")
    # Its creation time too, which tells a Deployment created again from the one the
    # operator wrote to (fights.recreated).
    created = apps.read_namespaced_deployment("llm", target).metadata.creation_timestamp
    assert before.created == created.timestamp()
    digest = template_batching(tuning, before.pod_spec, before.rolled_out).container
    assert digest is not None
    apps.patch_namespaced_deployment("llm", target, {"spec": {"paused": True}})
    apps.patch_namespaced_deployment("llm", target, {"spec": {"template": {"spec": {
        "containers": [{"name": "vllm", "args": ["--max-num-seqs", "32"]}]}}}})
    generation = int(apps.read_namespaced_deployment("llm", target).metadata.generation)
    wait_for(lambda: (apps.read_namespaced_deployment("llm", target).status
                      .observed_generation or 0) >= generation, "the template change seen",
             timeout_s=30)
    paused = deployment_replicas(target, "llm")
    assert not paused.rolled_out
    assert template_batching(tuning, paused.pod_spec, paused.rolled_out).container is None
    apps.patch_namespaced_deployment("llm", target, {"spec": {"paused": False}})
    wait_for(lambda: deployment_replicas(target, "llm").rolled_out, "the rollout done",
             timeout_s=60)
    after = deployment_replicas(target, "llm")
    changed = template_batching(tuning, after.pod_spec, after.rolled_out)
    assert changed.container not in (None, digest) and changed.value == 32
